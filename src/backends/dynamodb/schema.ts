import type { StepEntry, StoredRecord } from '../../core/store.js'
import { IdempotencyError } from '../../errors.js'
import { decodeHeaders } from '../records.js'

/** A DynamoDB attribute value, as the low-level client sends and returns it. */
export type AttributeValue =
  | { S: string }
  | { N: string }
  | { B: Uint8Array }
  | { BOOL: boolean }
  | { NULL: true }
  | Record<string, unknown>

/** One DynamoDB item: attribute name → value. */
export type Item = Record<string, AttributeValue>

/**
 * Names of the attributes the store reads and writes. The key and TTL attributes are configurable, for
 * tables shared with other items (single-table designs); the others live on the store's own items only.
 */
export interface DynamoDbAttributeNames {
  /** The table's partition key (type S). @default 'pk' */
  partitionKey?: string
  /** The table's sort key (type S), when the table has one: the store writes `sortKeyValue` into it. */
  sortKey?: string
  /** Epoch seconds after which DynamoDB's TTL may delete the item (type N). @default 'ttl' */
  ttl?: string
}

/** The store's own attributes (fixed names, short to keep items small). */
export const A = {
  scope: 'sc',
  key: 'k',
  fingerprint: 'fp',
  status: 'st',
  token: 'tok',
  lockedUntil: 'lu',
  responseStatus: 'rs',
  responseHeaders: 'rh',
  responseBody: 'rb',
  resourceId: 'rid',
  attempts: 'att',
  createdAt: 'ca',
  updatedAt: 'ua',
  expiresAt: 'ea',
  steps: 'sp',
} as const

const NAME = /^[A-Za-z0-9_.-]{1,255}$/
const OWN = new Set<string>(Object.values(A))

/** The resolved names, checked once. */
export interface ResolvedNames {
  partitionKey: string
  sortKey: string | undefined
  ttl: string
}

export function resolveNames(names: DynamoDbAttributeNames = {}): ResolvedNames {
  const resolved = { partitionKey: names.partitionKey ?? 'pk', sortKey: names.sortKey, ttl: names.ttl ?? 'ttl' }
  const given = [resolved.partitionKey, resolved.ttl, ...(resolved.sortKey === undefined ? [] : [resolved.sortKey])]
  for (const name of given) {
    if (!NAME.test(name) || OWN.has(name)) {
      throw new IdempotencyError(
        'INVALID_OPTION',
        `DynamoDbStore attribute name "${name}" is not usable: use 1-255 characters of A-Z a-z 0-9 _ . - , other than the store's own attributes (${[...OWN].join(', ')}).`,
      )
    }
  }
  if (new Set(given).size !== given.length) {
    throw new IdempotencyError('INVALID_OPTION', `DynamoDbStore attribute names must differ from each other; got ${given.join(', ')}.`)
  }
  return resolved
}

/** Every attribute name an expression uses goes through `#name` placeholders (`key`, `status`, `ttl` are reserved words). */
export function expressionNames(names: ResolvedNames): Record<string, string> {
  const out: Record<string, string> = { '#pk': names.partitionKey, '#ttl': names.ttl }
  for (const name of Object.values(A)) out[`#${name}`] = name
  return out
}

export const s = (value: string): { S: string } => ({ S: value })
export const n = (value: number): { N: string } => ({ N: String(value) })

function str(item: Item, name: string): string | null {
  const value = item[name] as { S?: string } | undefined
  return value?.S ?? null
}

function num(item: Item, name: string): number | null {
  const value = item[name] as { N?: string } | undefined
  return value?.N === undefined ? null : Number(value.N)
}

/** The steps of an item's `sp` map: name → result text, or NULL for a started marker. `undefined` when none. */
export function stepsOf(item: Item | undefined): StepEntry[] | undefined {
  const map = (item?.[A.steps] as { M?: Record<string, { S?: string }> } | undefined)?.M
  if (map === undefined) return undefined
  const entries: StepEntry[] = []
  for (const name of Object.keys(map)) entries.push({ name, result: map[name]?.S ?? null })
  return entries.length === 0 ? undefined : entries
}

/** True when the item was written by an idemkey store (it has the store's own attributes). */
export function isRecordItem(item: Item): boolean {
  return str(item, A.scope) !== null && str(item, A.key) !== null && num(item, A.token) !== null && str(item, A.status) !== null
}

/** The record an item holds; throws `STORE_SCHEMA` when the item is not one idemkey wrote. */
export function toRecord(item: Item, table: string): StoredRecord {
  if (!isRecordItem(item)) {
    throw new IdempotencyError(
      'STORE_SCHEMA',
      `dynamodb: table ${table} holds an item under an idemkey key that idemkey did not write (attributes ${Object.keys(item).join(', ')}). Give the store its own keyPrefix (or table), or delete the item if it is garbage.`,
    )
  }
  const status = str(item, A.status) as StoredRecord['status']
  const responseStatus = num(item, A.responseStatus)
  const body = (item[A.responseBody] as { B?: Uint8Array } | undefined)?.B
  return {
    scope: str(item, A.scope) as string,
    key: str(item, A.key) as string,
    fingerprint: str(item, A.fingerprint) as string,
    status,
    token: num(item, A.token) as number,
    lockedUntilMs: status === 'in_progress' ? num(item, A.lockedUntil) : null,
    response:
      status === 'in_progress' || responseStatus === null
        ? null
        : {
            status: responseStatus,
            headers: decodeHeaders(str(item, A.responseHeaders)),
            body: body === undefined ? new Uint8Array(0) : new Uint8Array(body),
          },
    resourceId: str(item, A.resourceId),
    attempts: num(item, A.attempts) ?? 1,
    createdAtMs: num(item, A.createdAt) as number,
    updatedAtMs: num(item, A.updatedAt) as number,
    expiresAtMs: num(item, A.expiresAt) as number,
  }
}
