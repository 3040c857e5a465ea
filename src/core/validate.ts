import { IdempotencyError } from '../errors.js'

/** Longest key and scope, in characters. */
export const MAX_KEY_LENGTH = 255

const KEY_CHARS = /^[\x20-\x7e]+$/
// Scopes may hold any printable text (tenant names in any language), but no control characters:
// they end up in SQL text columns, Redis key names and log lines.
// biome-ignore lint/suspicious/noControlCharactersInRegex: rejecting control characters is the point
const SCOPE_FORBIDDEN = /[\x00-\x1f\x7f]/
const FINGERPRINT = /^[0-9a-f]{64}$/

function describe(value: unknown): string {
  if (typeof value === 'string') return `a string of ${value.length} characters`
  return value === null ? 'null' : typeof value
}

/** Throws `KEY_INVALID` unless `key` is 1–255 characters, each 0x20–0x7E (printable ASCII). */
export function assertKey(key: unknown): asserts key is string {
  if (typeof key !== 'string' || key.length === 0 || key.length > MAX_KEY_LENGTH || !KEY_CHARS.test(key)) {
    throw new IdempotencyError(
      'KEY_INVALID',
      `Idempotency key must be 1-${MAX_KEY_LENGTH} printable ASCII characters (0x20-0x7E); got ${describe(key)}${
        typeof key === 'string' && key.length > 0 && key.length <= MAX_KEY_LENGTH ? ' with a character outside that range' : ''
      }. Use a UUID or another opaque token.`,
    )
  }
}

/** Throws `SCOPE_INVALID` unless `scope` is 1–255 characters with no control characters. */
export function assertScope(scope: unknown): asserts scope is string {
  if (typeof scope !== 'string' || scope.length === 0 || scope.length > MAX_KEY_LENGTH || SCOPE_FORBIDDEN.test(scope)) {
    throw new IdempotencyError(
      'SCOPE_INVALID',
      `Scope must be 1-${MAX_KEY_LENGTH} characters without control characters; got ${describe(scope)}. A tenant or account ID is a good scope.`,
    )
  }
}

/** Throws `FINGERPRINT_INVALID` unless `fingerprint` is a lowercase hex SHA-256 digest. */
export function assertFingerprint(fingerprint: unknown): asserts fingerprint is string {
  if (typeof fingerprint !== 'string' || fingerprint.length !== 64 || !FINGERPRINT.test(fingerprint)) {
    throw new IdempotencyError(
      'FINGERPRINT_INVALID',
      `Fingerprint must be a lowercase hex SHA-256 digest (64 characters); got ${describe(fingerprint)}. Use fingerprintOf(payload) to make one.`,
    )
  }
}

/** Throws `INVALID_ARGUMENT` unless `value` is a positive safe integer (tokens, durations, limits). */
export function assertPositiveInteger(value: unknown, name: string): asserts value is number {
  if (typeof value !== 'number' || !Number.isSafeInteger(value) || value <= 0) {
    throw new IdempotencyError('INVALID_ARGUMENT', `${name} must be a positive integer, got ${String(value)}.`)
  }
}

/** Throws `INVALID_OPTION` unless an option is undefined or a positive safe integer (a pool of "x" or 0 connections). */
export function assertOptionalPositiveInteger(value: unknown, name: string): void {
  if (value !== undefined && (typeof value !== 'number' || !Number.isSafeInteger(value) || value <= 0)) {
    throw new IdempotencyError('INVALID_OPTION', `${name} must be a positive integer, got ${JSON.stringify(value) ?? String(value)}.`)
  }
}

/** Checks the identity of a record: what every store operation starts with. */
export function assertIdentity(scope: unknown, key: unknown): void {
  assertScope(scope)
  assertKey(key)
}

/**
 * Throws `INVALID_OPTION` unless each named option is a function, or undefined where it is optional
 * (all but those listed in `required`), or a string where `orString` lists it: where a JavaScript
 * caller passed `scope: 'tenant-a'` or a key name where a function is expected, every request or job
 * failed with a TypeError, instead of the app at start-up.
 *
 * @example assertFunctions('idempotentTask()', { task, key: options.key }, { required: ['task'] })
 */
export function assertFunctions(
  where: string,
  options: Record<string, unknown>,
  kinds: { required?: readonly string[]; orString?: readonly string[] } = {},
): void {
  for (const [name, value] of Object.entries(options)) {
    if (typeof value === 'function' || (value === undefined && !kinds.required?.includes(name))) continue
    const string = kinds.orString?.includes(name) === true
    if (string && typeof value === 'string') continue
    throw new IdempotencyError(
      'INVALID_OPTION',
      `${where}: ${name} must be a function${string ? ' or a string' : ''} (e.g. ${name}: (…) => …), got ${value === undefined ? 'nothing' : describe(value)}.`,
    )
  }
}

/**
 * Throws `INVALID_OPTION` unless `value` is undefined or an object with each of `methods` (a clock
 * needs `now`, `sleep` and `timer`): a wrong one failed at the first run instead of at start-up.
 */
export function assertMethods(where: string, name: string, value: unknown, methods: readonly string[]): void {
  if (value === undefined) return
  const missing = methods.filter((method) => typeof (value as Record<string, unknown> | null)?.[method] !== 'function')
  if (missing.length > 0) {
    throw new IdempotencyError(
      'INVALID_OPTION',
      `${where}: ${name} must be an object with ${methods.map((m) => `${m}()`).join(', ')}; ${value === null || typeof value !== 'object' ? `got ${describe(value)}` : `it has no ${missing.map((m) => `${m}()`).join(', ')}`}.`,
    )
  }
}

/** A list-of-names option: undefined, or an array of non-empty strings, else `INVALID_OPTION` (`methods: 'POST'` crashed with a TypeError). */
export function nameList(value: unknown, name: string, example: string): string[] | undefined {
  if (value === undefined) return undefined
  if (!Array.isArray(value) || value.some((item) => typeof item !== 'string' || item === '')) {
    throw new IdempotencyError(
      'INVALID_OPTION',
      `${name} must be an array of names, e.g. ${name}: ${example}, got ${JSON.stringify(value)}.`,
    )
  }
  return value
}
