import { type Clock, systemClock } from '../../core/clock.js'
import { parseDuration, parseTimerDuration } from '../../core/duration.js'
import { assertRecordStep } from '../../core/steps-store.js'
import {
  type AcquireResult,
  DEFAULT_ABANDONED_RETENTION_MS,
  type IdempotencyStore,
  type ListFilter,
  type Outcome,
  type StoredRecord,
} from '../../core/store.js'
import { assertFingerprint, assertIdentity, assertPositiveInteger } from '../../core/validate.js'
import { IdempotencyError } from '../../errors.js'
import { BODY_OMITTED_HEADER } from '../../protocol/response-headers.js'
import { assertOutcome, encodeHeaders, listLimit, matchesFilter } from '../records.js'
import { migrateTable } from './migrate.js'
import type { DynamoDbStoreOptions } from './options.js'
import { DynamoDbRequests, isConditionFailed } from './requests.js'
import { A, expressionNames, type Item, isRecordItem, n, type ResolvedNames, resolveNames, s, stepsOf, toRecord } from './schema.js'

/** DynamoDB's item size limit is 400 KB; a response that would not fit is stored without its body. */
const MAX_ITEM_BYTES = 400 * 1024
/** Room kept for the item's other attributes and names (keys, scope, fingerprint, numbers). */
const ITEM_OVERHEAD_BYTES = 4 * 1024
/** An acquire re-reads and retries when the record changes between its write and its read; this bounds the loop. */
const MAX_ACQUIRE_ROUNDS = 16

const LIVE_FRESH = 'attribute_not_exists(#pk) OR #ea <= :now'
const HELD = '#tok = :tok AND #st = :inprog'

/**
 * Records in a DynamoDB table, shared by any number of processes, containers and Lambda functions.
 * Every change is one conditional write (`attribute_not_exists`, or a condition on the fencing token):
 * the write is the decision, no read-then-write. Reads are strongly consistent. Leases and expiry run on
 * the caller's clock with a skew margin (`clockSkew`); each item carries a TTL attribute so DynamoDB
 * deletes it after it expired, and reads treat an expired item as absent until then. See docs/dynamodb.md.
 *
 * @example
 * const store = new DynamoDbStore({ table: 'idemkey' })
 * await store.migrate() // once: creates the table and turns TTL on
 * const ledger = new Ledger({ store })
 */
export class DynamoDbStore implements IdempotencyStore {
  readonly name = 'dynamodb'
  readonly serverClock = false
  readonly table: string
  readonly #names: ResolvedNames
  readonly #exprNames: Record<string, string>
  readonly #prefix: string
  readonly #sortKeyValue: string
  readonly #clock: Clock
  readonly #skewMs: number
  readonly #retentionMs: number
  readonly #graceMs: number
  readonly #requests: DynamoDbRequests

  constructor(options: DynamoDbStoreOptions) {
    if (typeof options?.table !== 'string' || !/^[A-Za-z0-9_.-]{3,255}$/.test(options.table)) {
      throw new IdempotencyError(
        'INVALID_OPTION',
        `DynamoDbStore needs { table }: a DynamoDB table name of 3-255 characters A-Z a-z 0-9 _ . - ; got ${JSON.stringify(options?.table)}.`,
      )
    }
    if (options.client !== undefined && options.clientConfig !== undefined) {
      throw new IdempotencyError(
        'INVALID_OPTION',
        'DynamoDbStore takes { client } or { clientConfig }, not both: configure your own client instead.',
      )
    }
    if (options.client !== undefined && typeof options.client.send !== 'function') {
      throw new IdempotencyError(
        'INVALID_OPTION',
        'DynamoDbStore({ client }) needs a DynamoDBClient from @aws-sdk/client-dynamodb (something with send()).',
      )
    }
    this.table = options.table
    this.#names = resolveNames(options.attributes)
    this.#exprNames = expressionNames(this.#names)
    this.#prefix = options.keyPrefix ?? 'idemkey#'
    this.#sortKeyValue = options.sortKeyValue ?? 'idemkey'
    if (this.#prefix.length > 64 || /[\n]/.test(this.#prefix)) {
      throw new IdempotencyError(
        'INVALID_OPTION',
        `DynamoDbStore keyPrefix must be at most 64 characters without a newline; got ${JSON.stringify(this.#prefix)}.`,
      )
    }
    this.#clock = options.clock ?? systemClock
    this.#skewMs = parseDuration(options.clockSkew ?? '1s', 'clockSkew')
    this.#retentionMs = parseDuration(options.abandonedRetention ?? DEFAULT_ABANDONED_RETENTION_MS, 'abandonedRetention')
    this.#graceMs = parseDuration(options.expiredGrace ?? '1h', 'expiredGrace')
    this.#requests = new DynamoDbRequests({
      table: this.table,
      client: options.client,
      clientConfig: options.clientConfig,
      requestTimeoutMs: parseTimerDuration(options.requestTimeout ?? '10s', 'requestTimeout'),
      expressionNames: this.#exprNames,
    })
  }

  /**
   * Creates the table (on-demand capacity) when it does not exist, waits until it is active, and turns
   * TTL on for the TTL attribute. Safe to call from many processes at once; checks the key schema of a
   * table that already exists. Needs `dynamodb:CreateTable`, `DescribeTable` and `UpdateTimeToLive`.
   */
  async migrate(): Promise<void> {
    await migrateTable(this.#requests, this.table, this.#names)
  }

  async acquire(scope: string, key: string, fingerprint: string, leaseMs: number): Promise<AcquireResult> {
    assertIdentity(scope, key)
    assertFingerprint(fingerprint)
    assertPositiveInteger(leaseMs, 'leaseMs')
    const Key = this.#key(scope, key)
    for (let round = 0; round < MAX_ACQUIRE_ROUNDS; round++) {
      const now = this.#clock.now()
      const lockedUntil = now + leaseMs
      const expiresAt = lockedUntil + this.#retentionMs
      // What both writes below set: the new lease, its times and the record's expiry.
      const lease = {
        ':fp': s(fingerprint),
        ':inprog': s('in_progress'),
        ':one': n(1),
        ':lu': n(lockedUntil),
        ':now': n(now),
        ':ea': n(expiresAt),
        ':ttl': n(this.#ttlSeconds(expiresAt)),
        ':nosteps': { M: {} },
      }
      let item: Item | undefined
      try {
        const written = (await this.#requests.send('acquire', 'UpdateItemCommand', {
          TableName: this.table,
          Key,
          ConditionExpression: LIVE_FRESH,
          UpdateExpression:
            'SET #sc = :sc, #k = :k, #fp = :fp, #st = :inprog, #tok = if_not_exists(#tok, :zero) + :one, #lu = :lu, #att = :one, #ca = :now, #ua = :now, #ea = :ea, #ttl = :ttl, #sp = :nosteps REMOVE #rs, #rh, #rb, #rid',
          ExpressionAttributeNames: this.#exprNames,
          ExpressionAttributeValues: { ...lease, ':sc': s(scope), ':k': s(key), ':zero': n(0) },
          ReturnValues: 'UPDATED_NEW',
          ReturnValuesOnConditionCheckFailure: 'ALL_OLD',
        })) as { Attributes?: Item }
        return { kind: 'acquired', token: tokenOf(written.Attributes) }
      } catch (error) {
        if (!isConditionFailed(error)) throw error
        // DynamoDB returns the item that failed the condition; an emulator may not, so read it.
        item = conditionItem(error) ?? (await this.#read('acquire', Key))
      }
      if (item === undefined) continue // evicted or purged since the write: try again
      const record = toRecord(item, this.table)
      if (record.expiresAtMs <= now) continue // expired since the write: try again
      const takeoverBefore = now - this.#skewMs
      const live = record.status !== 'in_progress' || (record.lockedUntilMs as number) > takeoverBefore
      if (live) {
        if (record.fingerprint !== fingerprint) return { kind: 'mismatch' }
        if (record.status === 'in_progress') return { kind: 'in_progress', lockedUntilMs: (record.lockedUntilMs as number) + this.#skewMs }
        return { kind: 'replay', record }
      }
      // Another request takes an ended attempt over only if it left no steps: they are its own request's
      // partial effects (the condition below re-checks it, against a step recorded meanwhile).
      if (record.fingerprint !== fingerprint && (stepsOf(item)?.length ?? 0) > 0) return { kind: 'mismatch' }
      // Takeover: the lease ended (a crash, or a release). Fenced on the token seen, so only one taker wins.
      try {
        const written = (await this.#requests.send('acquire', 'UpdateItemCommand', {
          TableName: this.table,
          Key,
          ConditionExpression:
            '#tok = :seen AND #st = :inprog AND #lu <= :before AND (#fp = :fp OR attribute_not_exists(#sp) OR size(#sp) = :zero)',
          UpdateExpression:
            'SET #fp = :fp, #tok = #tok + :one, #att = #att + :one, #lu = :lu, #ua = :now, #ea = :ea, #ttl = :ttl, #sp = if_not_exists(#sp, :nosteps)',
          ExpressionAttributeNames: this.#exprNames,
          ExpressionAttributeValues: { ...lease, ':seen': n(record.token), ':before': n(takeoverBefore), ':zero': n(0) },
          ReturnValues: 'ALL_NEW',
        })) as { Attributes?: Item }
        // The steps the earlier attempt recorded come back with the takeover, in the same round trip.
        const steps = stepsOf(written.Attributes)
        if (steps === undefined) return { kind: 'acquired', token: tokenOf(written.Attributes) }
        return { kind: 'acquired', token: tokenOf(written.Attributes), steps }
      } catch (error) {
        if (!isConditionFailed(error)) throw error
        // Someone else took it, completed it or evicted it meanwhile: decide again from the top.
      }
    }
    throw new IdempotencyError(
      'STORE_UNAVAILABLE',
      `dynamodb: acquire of key "${key}" lost ${MAX_ACQUIRE_ROUNDS} races in a row to other writers of the same record. Retry the request; if it persists, something rewrites the item in a loop.`,
    )
  }

  /**
   * Stores one step in the record's `sp` map, fenced by token (docs/steps.md): a result replaces a marker;
   * a marker is written only where the name has nothing yet (`if_not_exists`), so it never replaces a result.
   */
  async recordStep(scope: string, key: string, token: number, name: string, result: string | null): Promise<boolean> {
    assertRecordStep(scope, key, token, name, result)
    if (!Number.isSafeInteger(token)) return false
    try {
      await this.#requests.send('recordStep', 'UpdateItemCommand', {
        TableName: this.table,
        Key: this.#key(scope, key),
        ConditionExpression: HELD,
        UpdateExpression: result === null ? 'SET #sp.#n = if_not_exists(#sp.#n, :v)' : 'SET #sp.#n = :v',
        ExpressionAttributeNames: { '#tok': A.token, '#st': A.status, '#sp': A.steps, '#n': name },
        ExpressionAttributeValues: { ':tok': n(token), ':inprog': s('in_progress'), ':v': result === null ? { NULL: true } : s(result) },
      })
      return true
    } catch (error) {
      if (isConditionFailed(error)) return false
      throw error
    }
  }

  async renew(scope: string, key: string, token: number, leaseMs: number): Promise<boolean> {
    assertIdentity(scope, key)
    assertPositiveInteger(leaseMs, 'leaseMs')
    if (!Number.isSafeInteger(token)) return false
    const now = this.#clock.now()
    const expiresAt = now + leaseMs + this.#retentionMs
    return this.#fenced('renew', scope, key, token, 'SET #lu = :lu, #ua = :now, #ea = :ea, #ttl = :ttl', {
      ':lu': n(now + leaseMs),
      ':now': n(now),
      ':ea': n(expiresAt),
      ':ttl': n(this.#ttlSeconds(expiresAt)),
    })
  }

  async complete(scope: string, key: string, token: number, outcome: Outcome, ttlMs: number): Promise<boolean> {
    assertIdentity(scope, key)
    assertPositiveInteger(ttlMs, 'ttlMs')
    assertOutcome(outcome)
    if (!Number.isSafeInteger(token)) return false
    const now = this.#clock.now()
    const expiresAt = now + ttlMs
    let headers = outcome.response.headers
    let body = outcome.response.body
    let headersText = encodeHeaders(headers)
    const resourceId = outcome.resourceId ?? null
    // The resource id is stored beside the body: a body that fits only without it made an item DynamoDB refuses.
    const resourceBytes = resourceId === null ? 0 : Buffer.byteLength(resourceId)
    if (
      body.byteLength +
        Buffer.byteLength(headersText) +
        resourceBytes +
        Buffer.byteLength(scope) * 2 +
        key.length * 2 +
        ITEM_OVERHEAD_BYTES >
      MAX_ITEM_BYTES
    ) {
      // Never a reason to run the operation twice: the status and headers replay, the body does not.
      headers = { ...headers, [BODY_OMITTED_HEADER]: headers[BODY_OMITTED_HEADER] ?? String(body.byteLength) }
      headersText = encodeHeaders(headers)
      body = new Uint8Array(0)
    }
    const set = ['#st = :st', '#rs = :rs', '#rh = :rh', '#ua = :now', '#ea = :ea', '#ttl = :ttl']
    // The steps served a takeover of the in-progress record; a completed record replays, so they go (and free room).
    const remove = ['#lu', '#sp']
    const values: Item = {
      ':st': s(outcome.status),
      ':rs': n(outcome.response.status),
      ':rh': s(headersText),
      ':now': n(now),
      ':ea': n(expiresAt),
      ':ttl': n(this.#ttlSeconds(expiresAt)),
    }
    if (body.byteLength > 0) {
      set.push('#rb = :rb')
      values[':rb'] = { B: body }
    } else remove.push('#rb')
    if (resourceId !== null) {
      set.push('#rid = :rid')
      values[':rid'] = s(resourceId)
    } else remove.push('#rid')
    return this.#fenced('complete', scope, key, token, `SET ${set.join(', ')} REMOVE ${remove.join(', ')}`, values)
  }

  async release(scope: string, key: string, token: number): Promise<boolean> {
    assertIdentity(scope, key)
    if (!Number.isSafeInteger(token)) return false
    const now = this.#clock.now()
    const expiresAt = now + this.#retentionMs
    return this.#fenced('release', scope, key, token, 'SET #lu = :now, #ua = :now, #ea = :ea, #ttl = :ttl', {
      ':now': n(now),
      ':ea': n(expiresAt),
      ':ttl': n(this.#ttlSeconds(expiresAt)),
    })
  }

  async get(scope: string, key: string): Promise<StoredRecord | null> {
    assertIdentity(scope, key)
    const item = await this.#read('get', this.#key(scope, key))
    if (item === undefined) return null
    const record = toRecord(item, this.table)
    return record.expiresAtMs > this.#clock.now() ? record : null
  }

  /**
   * Records for operators, oldest first: a strongly consistent Scan of the store's items (one page after
   * another), filtered and sorted here. Its cost grows with the table: keep it off hot paths.
   */
  async list(filter: ListFilter = {}): Promise<StoredRecord[]> {
    const limit = listLimit(filter)
    if (limit === 0) return []
    const now = this.#clock.now()
    const records: StoredRecord[] = []
    const prefix = filter.scope === undefined ? this.#prefix : `${this.#prefix}${filter.scope}\n`
    await this.#scan('list', prefix, undefined, (item) => {
      const record = toRecord(item, this.table)
      if (matchesFilter(record, filter, now)) records.push(record)
      return true
    })
    return records.sort((a, b) => a.createdAtMs - b.createdAtMs || compare(a.scope, b.scope) || compare(a.key, b.key)).slice(0, limit)
  }

  /**
   * Deletes up to `limit` expired records. DynamoDB's TTL deletes them by itself (`expiredGrace` after
   * they expired, within a day or two), so this is optional: it Scans the table, and each delete is
   * conditional on the record still being expired.
   */
  async purgeExpired(limit: number): Promise<number> {
    assertPositiveInteger(limit, 'limit')
    const now = this.#clock.now()
    let purged = 0
    const expired: Item[] = []
    await this.#scan('purgeExpired', this.#prefix, now, (item) => {
      expired.push(item)
      return expired.length < limit
    })
    for (const item of expired) {
      if (!isRecordItem(item)) continue
      try {
        await this.#requests.send('purgeExpired', 'DeleteItemCommand', {
          TableName: this.table,
          Key: this.#keyOfItem(item),
          ConditionExpression: '#ea <= :now',
          ExpressionAttributeNames: { '#ea': A.expiresAt },
          ExpressionAttributeValues: { ':now': n(now) },
        })
        purged++
      } catch (error) {
        if (!isConditionFailed(error)) throw error
      }
    }
    return purged
  }

  async evict(scope: string, key: string): Promise<boolean> {
    assertIdentity(scope, key)
    const deleted = (await this.#requests.send('evict', 'DeleteItemCommand', {
      TableName: this.table,
      Key: this.#key(scope, key),
      ReturnValues: 'ALL_OLD',
    })) as { Attributes?: Item }
    return deleted.Attributes !== undefined
  }

  /** Destroys the client when the store made it; leaves yours open. */
  async close(): Promise<void> {
    this.#requests.close()
  }

  #key(scope: string, key: string): Item {
    // Scopes hold no control characters, so the newline cannot be forged into a collision.
    const Key: Item = { [this.#names.partitionKey]: s(`${this.#prefix}${scope}\n${key}`) }
    if (this.#names.sortKey !== undefined) Key[this.#names.sortKey] = s(this.#sortKeyValue)
    return Key
  }

  #keyOfItem(item: Item): Item {
    const Key: Item = { [this.#names.partitionKey]: item[this.#names.partitionKey] as Item[string] }
    if (this.#names.sortKey !== undefined) Key[this.#names.sortKey] = item[this.#names.sortKey] as Item[string]
    return Key
  }

  #ttlSeconds(expiresAtMs: number): number {
    return Math.ceil((expiresAtMs + this.#graceMs) / 1000)
  }

  /** A write conditioned on `token` being current and the record in progress; `false` when it is not. */
  async #fenced(operation: string, scope: string, key: string, token: number, update: string, values: Item): Promise<boolean> {
    try {
      await this.#requests.send(operation, 'UpdateItemCommand', {
        TableName: this.table,
        Key: this.#key(scope, key),
        ConditionExpression: HELD,
        UpdateExpression: update,
        ExpressionAttributeNames: this.#exprNames,
        ExpressionAttributeValues: { ...values, ':tok': n(token), ':inprog': s('in_progress') },
      })
      return true
    } catch (error) {
      if (isConditionFailed(error)) return false
      throw error
    }
  }

  async #read(operation: string, Key: Item): Promise<Item | undefined> {
    const read = (await this.#requests.send(operation, 'GetItemCommand', { TableName: this.table, Key, ConsistentRead: true })) as {
      Item?: Item
    }
    return read.Item
  }

  /** Scans the store's items under `prefix` (expired at `expiredAt` when given); `onItem` returns false to stop. */
  async #scan(operation: string, prefix: string, expiredAt: number | undefined, onItem: (item: Item) => boolean): Promise<void> {
    const conditions = ['begins_with(#pk, :prefix)']
    const names: Record<string, string> = { '#pk': this.#names.partitionKey }
    const values: Item = { ':prefix': s(prefix) }
    if (this.#names.sortKey !== undefined) {
      conditions.push('#sk = :skv')
      names['#sk'] = this.#names.sortKey
      values[':skv'] = s(this.#sortKeyValue)
    }
    if (expiredAt !== undefined) {
      conditions.push('#ea <= :now')
      names['#ea'] = A.expiresAt
      values[':now'] = n(expiredAt)
    }
    let start: Item | undefined
    do {
      const page = (await this.#requests.send(operation, 'ScanCommand', {
        TableName: this.table,
        ConsistentRead: true,
        FilterExpression: conditions.join(' AND '),
        ExpressionAttributeNames: names,
        ExpressionAttributeValues: values,
        ExclusiveStartKey: start,
      })) as { Items?: Item[]; LastEvaluatedKey?: Item }
      for (const item of page.Items ?? []) if (!onItem(item)) return
      start = page.LastEvaluatedKey
    } while (start !== undefined)
  }
}

function conditionItem(error: unknown): Item | undefined {
  return (error as { Item?: Item }).Item
}

function tokenOf(attributes: Item | undefined): number {
  const value = (attributes?.[A.token] as { N?: string } | undefined)?.N
  if (value === undefined)
    throw new IdempotencyError(
      'STORE_UNAVAILABLE',
      'dynamodb: acquire got no token back from the write. The endpoint does not return UPDATED_NEW values; use DynamoDB or DynamoDB Local.',
    )
  return Number(value)
}

function compare(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0
}
