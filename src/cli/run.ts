import { isIdempotencyError } from '../errors.js'
import { type OpenedStore, openStore } from '../stores/open.js'

/** A failure the CLI reports in one line, without a stack trace: bad input, a refused confirmation. */
export class CliError extends Error {
  override name = 'CliError' as const
  /** The process exit code. @default 1 */
  readonly exitCode: number
  constructor(message: string, exitCode = 1) {
    super(message)
    this.exitCode = exitCode
  }
}

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

/** The one line printed for a failed command: what happened and, where idemkey knows, what to do. */
export function describeFailure(error: unknown): { message: string; exitCode: number } {
  if (error instanceof CliError) return { message: error.message, exitCode: error.exitCode }
  if (isIdempotencyError(error)) return { message: `${error.message} [${error.code}]`, exitCode: 1 }
  if (error instanceof Error) return { message: error.stack ?? error.message, exitCode: 1 }
  return { message: String(error), exitCode: 1 }
}
