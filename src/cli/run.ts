import { existsSync } from 'node:fs'
import { resolve } from 'node:path'
import { isIdempotencyError } from '../errors.js'
import { type OpenedStore, openStore, parseStoreUrl, type StoreSpec } from './store-url.js'

/** A failure the CLI reports in one line, without a stack trace: bad input, a refused confirmation. */
export class CliError extends Error {
  override name = 'CliError' as const
  /** The process exit code. @default 1 */
  readonly exitCode: number
  /** A flag given wrong, reported as commander reports one: `error: …` and the line pointing to --help. */
  readonly usage: boolean
  constructor(message: string, exitCode = 1, usage = false) {
    super(message)
    this.exitCode = exitCode
    this.usage = usage
  }
}

/** The line after a usage error, as commander prints it (`showHelpAfterError`). */
export const HELP_HINT = '(add --help for usage and examples)'

/**
 * Opens the store a command names, runs `fn`, and closes the store whatever happens.
 *
 * @example await withStore(options.store, async ({ store }) => store.get(scope, key))
 */
export async function withStore<R>(url: string, fn: (opened: OpenedStore) => Promise<R>): Promise<R> {
  const opened = await openStore(url)
  try {
    return await fn(opened)
  } finally {
    await opened.store.close().catch(() => {})
  }
}

/**
 * {@link withStore} for a command that reads or purges (list, inspect, gc, evict): a SQLite file that
 * does not exist is refused rather than created, since an empty new store would only answer "no
 * records" about the wrong file. Server stores are opened as they are.
 */
export async function withExistingStore<R>(url: string, command: string, fn: (opened: OpenedStore) => Promise<R>): Promise<R> {
  assertStoreExists(parseStoreUrl(url), command)
  return withStore(url, fn)
}

/** Refuses a SQLite file that does not exist (see {@link withExistingStore}); server stores pass. */
export function assertStoreExists(spec: StoreSpec, command: string): void {
  if (spec.kind === 'sqlite' && spec.path !== ':memory:' && !existsSync(spec.path)) {
    throw new CliError(
      `No store at ${spec.url}: ${resolve(spec.path)} does not exist, and ${command} does not create one. Pass --store with the store your app uses (e.g. --store sqlite:data/idemkey.db or --store postgres://app@127.0.0.1:5432/app), or set IDEMKEY_STORE; idemkey migrate --store … creates a new one.`,
      2,
    )
  }
}

/** The one line printed for a failed command: what happened and, where idemkey knows, what to do. */
export function describeFailure(error: unknown): { message: string; exitCode: number } {
  if (error instanceof CliError) return { message: error.message, exitCode: error.exitCode }
  if (isIdempotencyError(error)) return { message: `${error.message} [${error.code}]`, exitCode: 1 }
  if (error instanceof Error) return { message: error.stack ?? error.message, exitCode: 1 }
  return { message: String(error), exitCode: 1 }
}
