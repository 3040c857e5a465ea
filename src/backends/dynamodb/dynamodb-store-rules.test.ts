import {
  CreateTableCommand,
  DeleteItemCommand,
  DescribeTableCommand,
  DynamoDBClient,
  GetItemCommand,
  PutItemCommand,
  UpdateItemCommand,
  UpdateTimeToLiveCommand,
} from '@aws-sdk/client-dynamodb'
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest'
import { type DynamoDbEndpoint, startDynamoDb } from '../../../test/helpers/dynalite.js'
import { eventually } from '../../../test/helpers/eventually.js'
import { TcpFaultProxy } from '../../../test/helpers/tcp-fault-proxy.js'
import { ManualClock } from '../../core/clock.js'
import type { Outcome } from '../../core/store.js'
import { fp, sampleOutcome } from '../../testing/index.js'
import { type DynamoDbClientLike, DynamoDbStore, type DynamoDbStoreOptions } from './index.js'

// The rules DynamoDbStore keeps around its conditional writes: the checks of its options, the items it
// writes (keys, TTL, body), migrate() on tables that are not what it wants, the acquire loop when another
// writer moves the record between the failed write and the read, list, purge, close, and the errors each
// operation reports. Against dynalite on a loopback port (or IDEMKEY_DYNAMODB_ENDPOINT), as in
// dynamodb-store.test.ts; where a test needs DynamoDB to answer otherwise (a table still CREATING, a
// throttled request), the store's client is a real client whose sends pass through a hook.
const dynamo: DynamoDbEndpoint = await startDynamoDb()
afterAll(() => dynamo.stop())
const raw = dynamo.client()
const T0 = Date.UTC(2030, 0, 1)
const HOUR = 3_600_000
const DAY = 24 * HOUR

// biome-ignore lint/suspicious/noExplicitAny: the hook sees any SDK command and answers what its send would
type Command = any
type Hook = (command: Command, forward: () => Promise<Command>) => Promise<unknown>

/** A real client on the test endpoint whose every send goes through `hook` (which may forward it, change its answer or fail it). */
function hooked(hook: Hook): { client: DynamoDbClientLike; sent: Command[] } {
  const real = dynamo.client()
  const sent: Command[] = []
  const client: DynamoDbClientLike = {
    send(command) {
      sent.push(command)
      return Promise.resolve(hook(command, () => real.send(command as GetItemCommand)))
    },
  }
  return { client, sent }
}

/** Whether a command is the takeover write of an acquire (fenced on the token it saw). */
const isTakeover = (command: Command): boolean =>
  command instanceof UpdateItemCommand && ':seen' in (command.input.ExpressionAttributeValues ?? {})

/** An error as the SDK throws it for a refused request (throttling, missing permission). */
function sdkError(name: string, message = `${name} (injected)`): Error {
  return Object.assign(new Error(message), { name })
}

/** The client configuration of a store that makes its own client on the test endpoint. */
function ownClientConfig(): Record<string, unknown> {
  return dynamo.endpoint === undefined
    ? { maxAttempts: 1 }
    : { endpoint: dynamo.endpoint, region: 'us-east-1', credentials: { accessKeyId: 'test', secretAccessKey: 'test' }, maxAttempts: 1 }
}

function thrown(make: () => unknown): { code?: string; message: string } {
  try {
    make()
  } catch (error) {
    return error as { code?: string; message: string }
  }
  throw new Error('expected it to throw')
}

async function rawItem(table: string, Key: Record<string, { S: string }>) {
  return (await raw.send(new GetItemCommand({ TableName: table, Key, ConsistentRead: true }))).Item
}

const outcome = (body: Uint8Array, headers: Record<string, string> = {}): Outcome => ({
  status: 'completed',
  response: { status: 200, headers, body },
})

describe('DynamoDbStore options, checked in the constructor', () => {
  it('is named dynamodb and runs leases on the callers’ clocks', () => {
    const store = new DynamoDbStore({ table: 'idemkey' })
    expect(store.name).toBe('dynamodb')
    expect(store.serverClock).toBe(false)
  })

  it('refuses a table name that is not 3-255 characters of A-Z a-z 0-9 _ . - with INVALID_OPTION quoting it', () => {
    for (const table of [undefined, 42, 'ab', 'a'.repeat(256), 'my table', 'orders!', '!orders']) {
      const error = thrown(() => new DynamoDbStore({ table } as unknown as DynamoDbStoreOptions))
      expect(error).toMatchObject({ code: 'INVALID_OPTION', message: expect.stringContaining(`got ${JSON.stringify(table)}.`) })
    }
    expect(thrown(() => new DynamoDbStore(undefined as unknown as DynamoDbStoreOptions))).toMatchObject({
      code: 'INVALID_OPTION',
      message: expect.stringContaining('needs { table }'),
    })
    for (const table of ['abc', 'a'.repeat(255), 'A-z_0.9']) expect(new DynamoDbStore({ table }).table).toBe(table)
  })

  it('takes a client or a clientConfig, not both, and only a client that has send()', () => {
    expect(thrown(() => new DynamoDbStore({ table: 'idemkey', client: raw, clientConfig: { region: 'eu-west-1' } }))).toMatchObject({
      code: 'INVALID_OPTION',
      message: expect.stringContaining('{ client } or { clientConfig }, not both'),
    })
    expect(thrown(() => new DynamoDbStore({ table: 'idemkey', client: { destroy() {} } as unknown as DynamoDbClientLike }))).toMatchObject({
      code: 'INVALID_OPTION',
      message: expect.stringContaining('something with send()'),
    })
  })

  it('takes a keyPrefix of at most 64 characters without a newline', () => {
    expect(() => new DynamoDbStore({ table: 'idemkey', keyPrefix: 'p'.repeat(64) })).not.toThrow()
    for (const keyPrefix of ['p'.repeat(65), 'a\nb']) {
      expect(thrown(() => new DynamoDbStore({ table: 'idemkey', keyPrefix }))).toMatchObject({
        code: 'INVALID_OPTION',
        message: `DynamoDbStore keyPrefix must be at most 64 characters without a newline; got ${JSON.stringify(keyPrefix)}.`,
      })
    }
  })

  it('refuses an attribute name that is unusable or one of its own, listing its own, and names that clash, listing them', () => {
    const own = 'sc, k, fp, st, tok, lu, rs, rh, rb, rid, att, ca, ua, ea, sp'
    for (const attributes of [{ ttl: 'sc' }, { sortKey: 'has space' }, { partitionKey: '' }]) {
      const name = Object.values(attributes)[0]
      expect(thrown(() => new DynamoDbStore({ table: 'idemkey', attributes }))).toMatchObject({
        code: 'INVALID_OPTION',
        message: `DynamoDbStore attribute name "${name}" is not usable: use 1-255 characters of A-Z a-z 0-9 _ . - , other than the store's own attributes (${own}).`,
      })
    }
    expect(thrown(() => new DynamoDbStore({ table: 'idemkey', attributes: { partitionKey: 'PK', sortKey: 'PK' } }))).toMatchObject({
      code: 'INVALID_OPTION',
      message: 'DynamoDbStore attribute names must differ from each other; got PK, ttl, PK.',
    })
    expect(thrown(() => new DynamoDbStore({ table: 'idemkey', attributes: { sortKey: 'ttl' } }))).toMatchObject({
      code: 'INVALID_OPTION',
      message: expect.stringContaining('got pk, ttl, ttl.'),
    })
  })

  it('names the duration option it cannot read', () => {
    for (const option of ['clockSkew', 'abandonedRetention', 'expiredGrace']) {
      expect(thrown(() => new DynamoDbStore({ table: 'idemkey', [option]: 'soon' }))).toMatchObject({
        code: 'INVALID_OPTION',
        message: expect.stringMatching(new RegExp(`^${option} "soon" is not a duration`)),
      })
    }
  })

  it('names the argument it refuses: leaseMs, ttlMs, the purge limit', async () => {
    const store = new DynamoDbStore({ table: 'idemkey', client: raw })
    const named = (message: string) => expect.objectContaining({ code: 'INVALID_ARGUMENT', message })
    await expect(store.acquire('s', 'k', fp('a'), 0)).rejects.toEqual(named('leaseMs must be a positive integer, got 0.'))
    await expect(store.renew('s', 'k', 1, -5)).rejects.toEqual(named('leaseMs must be a positive integer, got -5.'))
    await expect(store.complete('s', 'k', 1, sampleOutcome(), 1.5)).rejects.toEqual(named('ttlMs must be a positive integer, got 1.5.'))
    await expect(store.purgeExpired(0)).rejects.toEqual(named('limit must be a positive integer, got 0.'))
  })
})

describe('DynamoDbStore items: keys, TTL, body', () => {
  const table = dynamo.table('rules-items')
  const clock = new ManualClock(T0 + 1)
  const store = new DynamoDbStore({ table, client: dynamo.client(), clock, expiredGrace: '10s' })
  beforeAll(() => store.migrate())

  it('writes the partition key idemkey# + scope + newline + key, with a TTL of the expiry plus expiredGrace in epoch seconds, rounded up', async () => {
    expect(await store.acquire('ttl', 'k', fp('a'), 1_000)).toEqual({ kind: 'acquired', token: 1 })
    const acquired = await rawItem(table, { pk: { S: 'idemkey#ttl\nk' } })
    // Expiry: now + lease + abandonedRetention (24h); TTL: that + 10s, in seconds, rounded up (now is T0 + 1 ms).
    expect(acquired?.ea).toEqual({ N: String(T0 + 1 + 1_000 + DAY) })
    expect(acquired?.ttl).toEqual({ N: String((T0 + 1_000 + DAY + 10_000) / 1_000 + 1) })
    expect(await store.complete('ttl', 'k', 1, sampleOutcome(), 60_000)).toBe(true)
    const completed = await rawItem(table, { pk: { S: 'idemkey#ttl\nk' } })
    expect(completed?.ttl).toEqual({ N: String((T0 + 60_000 + 10_000) / 1_000 + 1) })
  })

  it('stores a body that fits the item limit exactly, and omits one a byte longer, counting scope bytes and key length twice', async () => {
    const headers = { location: '/x' }
    const scope = 'size-éé'
    const keys = { fits: `${'f'.repeat(199)}1`, over: `${'f'.repeat(199)}2` }
    const room = 400 * 1024 - 4 * 1024 - Buffer.byteLength(JSON.stringify(headers)) - Buffer.byteLength(scope) * 2 - keys.fits.length * 2
    for (const key of Object.values(keys)) expect((await store.acquire(scope, key, fp('a'), 10_000)).kind).toBe('acquired')
    expect(await store.complete(scope, keys.fits, 1, outcome(new Uint8Array(room).fill(1), headers), 60_000)).toBe(true)
    expect(await store.complete(scope, keys.over, 1, outcome(new Uint8Array(room + 1).fill(2), headers), 60_000)).toBe(true)
    const fits = await store.get(scope, keys.fits)
    expect(fits?.response?.body.byteLength).toBe(room)
    expect(fits?.response?.headers).toEqual(headers)
    const over = await store.get(scope, keys.over)
    expect(over?.response?.body.byteLength).toBe(0)
    expect(over?.response?.headers).toEqual({ ...headers, 'idempotent-body-omitted': String(room + 1) })
  })

  it('counts the resource id against the item limit: a body that fits beside it is kept, one that does not is omitted, never an outcome DynamoDB refuses', async () => {
    const scope = 'size-rid'
    const resourceId = `rid_${'r'.repeat(8 * 1024)}`
    const room = 400 * 1024 - 4 * 1024 - Buffer.byteLength('{}') - Buffer.byteLength(scope) * 2 - 'k'.length * 2
    expect((await store.acquire(scope, 'k', fp('a'), 10_000)).kind).toBe('acquired')
    const body = new Uint8Array(room).fill(3)
    expect(await store.complete(scope, 'k', 1, { ...outcome(body), resourceId }, 60_000)).toBe(true)
    const stored = await store.get(scope, 'k')
    expect(stored?.status).toBe('completed')
    expect(stored?.resourceId).toBe(resourceId)
    expect(stored?.response?.body.byteLength).toBe(0)
    expect(stored?.response?.headers).toEqual({ 'idempotent-body-omitted': String(room) })
  })

  it('stores an empty body as no body attribute, and reads it back as empty', async () => {
    await store.acquire('empty', 'k', fp('a'), 10_000)
    expect(await store.complete('empty', 'k', 1, outcome(new Uint8Array(0)), 60_000)).toBe(true)
    const item = await rawItem(table, { pk: { S: 'idemkey#empty\nk' } })
    expect(item?.st).toEqual({ S: 'completed' })
    expect(item).not.toHaveProperty('rb')
    expect((await store.get('empty', 'k'))?.response).toEqual({ status: 200, headers: {}, body: new Uint8Array(0) })
  })

  it('reads an in-progress record with its lease end and no response, and a record at its expiry as absent', async () => {
    const start = clock.now()
    await store.acquire('expiry', 'k', fp('a'), 5_000)
    expect(await store.get('expiry', 'k')).toMatchObject({ status: 'in_progress', lockedUntilMs: start + 5_000, response: null })
    expect(await store.complete('expiry', 'k', 1, sampleOutcome(), 60_000)).toBe(true)
    clock.advance(59_999)
    expect((await store.get('expiry', 'k'))?.status).toBe('completed')
    clock.advance(1)
    expect(await store.get('expiry', 'k')).toBeNull()
  })

  it('answers false to renew, complete and release with a token that is not a safe integer, changing nothing', async () => {
    expect(await store.acquire('fenced', 'k', fp('a'), 10_000)).toEqual({ kind: 'acquired', token: 1 })
    const before = await store.get('fenced', 'k')
    for (const token of [1.5, Number.NaN, Number.POSITIVE_INFINITY]) {
      expect(await store.renew('fenced', 'k', token, 60_000)).toBe(false)
      expect(await store.complete('fenced', 'k', token, sampleOutcome(), 60_000)).toBe(false)
      expect(await store.release('fenced', 'k', token)).toBe(false)
    }
    expect(await store.get('fenced', 'k')).toEqual(before)
  })

  it('refuses to read an item under an idemkey key that lacks its scope, key, token or status, as STORE_SCHEMA naming its attributes', async () => {
    const complete = { sc: { S: 'foreign' }, k: { S: 'k' }, tok: { N: '1' }, st: { S: 'completed' } }
    for (const missing of Object.keys(complete)) {
      const attributes = Object.fromEntries(Object.entries(complete).filter(([name]) => name !== missing))
      await raw.send(new PutItemCommand({ TableName: table, Item: { pk: { S: 'idemkey#foreign\nk' }, ...attributes } }))
      const error = await store.get('foreign', 'k').then(
        () => undefined,
        (failure: unknown) => failure,
      )
      expect(error).toMatchObject({
        code: 'STORE_SCHEMA',
        message: expect.stringContaining(`table ${table} holds an item under an idemkey key`),
      })
      const listed = /\(attributes ([^)]*)\)/.exec((error as Error).message)?.[1]
      expect(listed?.split(', ').sort()).toEqual(['pk', ...Object.keys(attributes)].sort())
    }
  })
})

describe('DynamoDbStore on a table with a sort key', () => {
  const table = dynamo.table('rules-sorted')
  const attributes = { partitionKey: 'PK', sortKey: 'SK' }
  const clock = new ManualClock()
  const store = new DynamoDbStore({ table, client: dynamo.client(), clock, attributes })
  beforeAll(() => store.migrate())

  it('creates the table with the sort key, and writes sortKeyValue idemkey into it by default, or the value given', async () => {
    const described = await raw.send(new DescribeTableCommand({ TableName: table }))
    expect(described.Table?.KeySchema).toEqual([
      { AttributeName: 'PK', KeyType: 'HASH' },
      { AttributeName: 'SK', KeyType: 'RANGE' },
    ])
    const other = new DynamoDbStore({ table, client: dynamo.client(), clock, attributes, sortKeyValue: 'OTHER' })
    await store.acquire('s', 'k', fp('a'), 10_000)
    await other.acquire('s', 'k', fp('b'), 10_000)
    expect((await rawItem(table, { PK: { S: 'idemkey#s\nk' }, SK: { S: 'idemkey' } }))?.fp).toEqual({ S: fp('a') })
    expect((await rawItem(table, { PK: { S: 'idemkey#s\nk' }, SK: { S: 'OTHER' } }))?.fp).toEqual({ S: fp('b') })
  })

  it('lists and purges only the items with its sort key value', async () => {
    await raw.send(
      new PutItemCommand({
        TableName: table,
        Item: { PK: { S: 'idemkey#app\norder-1' }, SK: { S: 'ORDER' }, ea: { N: '0' }, total: { N: '5' } },
      }),
    )
    await store.acquire('app', 'order-1', fp('a'), 10_000)
    expect((await store.list({ scope: 'app' })).map((record) => record.key)).toEqual(['order-1'])
    clock.advance(2 * DAY)
    expect(await store.purgeExpired(100)).toBeGreaterThanOrEqual(1)
    expect(await store.list({ includeExpired: true })).toEqual([])
    expect(await rawItem(table, { PK: { S: 'idemkey#app\norder-1' }, SK: { S: 'ORDER' } })).toHaveProperty('total')
  })
})

describe('DynamoDbStore.migrate() on tables that are not what it wants', () => {
  it('refuses a table whose keys differ, naming the key schema it found and the one it wants', async () => {
    const plain = dynamo.table('rules-plain')
    const sorted = dynamo.table('rules-zz')
    const zz = { partitionKey: 'zz', sortKey: 'aa' }
    await new DynamoDbStore({ table: plain, client: raw }).migrate()
    await new DynamoDbStore({ table: sorted, client: raw, attributes: zz }).migrate()
    await expect(new DynamoDbStore({ table: plain, client: raw, attributes: zz }).migrate()).rejects.toMatchObject({
      code: 'STORE_SCHEMA',
      message: expect.stringContaining(`table ${plain} has the key schema (pk:HASH), but the store is configured for (aa:RANGE, zz:HASH).`),
    })
    await expect(new DynamoDbStore({ table: sorted, client: raw }).migrate()).rejects.toMatchObject({
      code: 'STORE_SCHEMA',
      message: expect.stringContaining(
        `table ${sorted} has the key schema (aa:RANGE, zz:HASH), but the store is configured for (pk:HASH).`,
      ),
    })
  })

  it('waits for a table that is not ACTIVE yet, then turns TTL on for the configured TTL attribute', async () => {
    const table = dynamo.table('rules-creating')
    let describes = 0
    const { client, sent } = hooked(async (command, forward) => {
      const answer = await forward()
      if (command instanceof DescribeTableCommand && ++describes === 1)
        return { ...answer, Table: { ...answer.Table, TableStatus: 'CREATING' } }
      return answer
    })
    await new DynamoDbStore({ table, client, attributes: { ttl: 'expiry' } }).migrate()
    expect(describes).toBeGreaterThanOrEqual(2)
    const ttl = sent.filter((command) => command instanceof UpdateTimeToLiveCommand).map((command) => command.input)
    expect(ttl).toEqual([{ TableName: table, TimeToLiveSpecification: { Enabled: true, AttributeName: 'expiry' } }])
  })

  it('gives up with STORE_UNAVAILABLE on a table still not ACTIVE 2 minutes in', async () => {
    const table = dynamo.table('rules-stuck')
    const realNow = Date.now.bind(Date)
    let describes = 0
    let skipped = 0
    const now = vi.spyOn(Date, 'now').mockImplementation(() => realNow() + skipped)
    try {
      const { client } = hooked(async (command, forward) => {
        const answer = await forward()
        if (!(command instanceof DescribeTableCommand)) return answer
        describes++
        if (describes === 2) skipped = 121_000 // two minutes pass while DynamoDB answers
        return describes <= 3 ? { ...answer, Table: { ...answer.Table, TableStatus: 'CREATING' } } : answer
      })
      await expect(new DynamoDbStore({ table, client }).migrate()).rejects.toMatchObject({
        code: 'STORE_UNAVAILABLE',
        message: `dynamodb: table ${table} did not become ACTIVE within 2 minutes (status CREATING). Call migrate() again.`,
      })
      expect(describes).toBe(2)
    } finally {
      now.mockRestore()
    }
  })

  it('reports a failed CreateTable or UpdateTimeToLive as STORE_UNAVAILABLE with the SDK error as cause, and accepts TTL already on', async () => {
    const table = dynamo.table('rules-denied')
    for (const refused of [CreateTableCommand, UpdateTimeToLiveCommand]) {
      const denied = sdkError('AccessDeniedException')
      const { client } = hooked((command, forward) => (command instanceof refused ? Promise.reject(denied) : forward()))
      await expect(new DynamoDbStore({ table, client }).migrate()).rejects.toMatchObject({
        code: 'STORE_UNAVAILABLE',
        message: expect.stringContaining('dynamodb: migrate failed: AccessDeniedException (injected)'),
        cause: denied,
      })
    }
    // A second migrate on DynamoDB: UpdateTimeToLive answers that TTL is on already.
    const { client } = hooked((command, forward) =>
      command instanceof UpdateTimeToLiveCommand
        ? Promise.reject(sdkError('ValidationException', 'TimeToLive is already enabled'))
        : forward(),
    )
    await expect(new DynamoDbStore({ table, client }).migrate()).resolves.toBeUndefined()
  })

  it('reports a table gone after CreateTable as STORE_UNAVAILABLE, not as a table to migrate', async () => {
    const table = dynamo.table('rules-vanished')
    const gone = hooked((command, forward) => (command instanceof CreateTableCommand ? Promise.resolve({}) : forward()))
    await expect(new DynamoDbStore({ table, client: gone.client }).migrate()).rejects.toMatchObject({
      code: 'STORE_UNAVAILABLE',
      message: expect.stringContaining('dynamodb: migrate failed'),
      cause: expect.objectContaining({ name: 'ResourceNotFoundException' }),
    })
  })
})

describe('DynamoDbStore.acquire when another writer moves the record between its write and its read', () => {
  const table = dynamo.table('rules-races')
  const clock = new ManualClock()
  beforeAll(() => new DynamoDbStore({ table, client: raw }).migrate())
  /** A store whose reads (only acquire's read after a failed write, in these tests) run `beforeRead` first. */
  const storeReading = (beforeRead: (read: number) => Promise<void> | void) => {
    let reads = 0
    const wrapped = hooked(async (command, forward) => {
      if (command instanceof GetItemCommand) await beforeRead(++reads)
      return forward()
    })
    return { store: new DynamoDbStore({ table, client: wrapped.client, clock, clockSkew: 0 }), sent: wrapped.sent }
  }
  const other = new DynamoDbStore({ table, client: raw, clock, clockSkew: 0 })

  it('starts afresh, continuing nothing, when the record is evicted before the read', async () => {
    await other.acquire('evicted', 'k', fp('a'), 10_000)
    const { store } = storeReading(async (read) => {
      if (read === 1) await other.evict('evicted', 'k')
    })
    expect(await store.acquire('evicted', 'k', fp('b'), 10_000)).toEqual({ kind: 'acquired', token: 1 })
  })

  it('starts afresh, continuing the token, when the record reached its expiry before the read', async () => {
    await other.acquire('expired', 'k', fp('a'), 10_000)
    const { store } = storeReading(async (read) => {
      if (read !== 1) return
      await raw.send(
        new UpdateItemCommand({
          TableName: table,
          Key: { pk: { S: 'idemkey#expired\nk' } },
          UpdateExpression: 'SET ea = :now',
          ExpressionAttributeValues: { ':now': { N: String(clock.now()) } },
        }),
      )
    })
    expect(await store.acquire('expired', 'k', fp('b'), 10_000)).toEqual({ kind: 'acquired', token: 2 })
  })

  it('decides again when another caller takes the ended lease over first', async () => {
    const start = clock.now()
    await other.acquire('taken', 'k', fp('a'), 1_000)
    clock.advance(1_000)
    let takeovers = 0
    const { client } = hooked(async (command, forward) => {
      if (isTakeover(command) && ++takeovers === 1) {
        // The other caller's takeover lands between this store's read and its own takeover write.
        expect(await other.acquire('taken', 'k', fp('a'), 5_000)).toEqual({ kind: 'acquired', token: 2 })
      }
      return forward()
    })
    const store = new DynamoDbStore({ table, client, clock, clockSkew: 0 })
    expect(await store.acquire('taken', 'k', fp('a'), 10_000)).toEqual({ kind: 'in_progress', lockedUntilMs: start + 6_000 })
    expect(takeovers).toBe(1)
  })

  it('gives up with STORE_UNAVAILABLE after 16 rounds in which the record vanished before the read', async () => {
    await other.acquire('vanishing', 'k', fp('a'), 10_000)
    let writes = 0
    const { client } = hooked(async (command, forward) => {
      if (command instanceof GetItemCommand) return {}
      if (command instanceof UpdateItemCommand && ++writes > 40) throw new Error('the store does not stop')
      return forward()
    })
    await expect(new DynamoDbStore({ table, client, clock }).acquire('vanishing', 'k', fp('b'), 10_000)).rejects.toMatchObject({
      code: 'STORE_UNAVAILABLE',
      message: expect.stringContaining('dynamodb: acquire of key "k" lost 16 races in a row'),
    })
    expect(writes).toBe(16)
  })

  it('uses the item DynamoDB returns with a failed condition, without reading it again', async () => {
    await other.acquire('returned', 'k', fp('a'), 10_000)
    // DynamoDB answers ReturnValuesOnConditionCheckFailure: ALL_OLD with the item on the error; dynalite does not.
    const { client, sent } = hooked(async (command, forward) => {
      try {
        return await forward()
      } catch (error) {
        if (command.input.ReturnValuesOnConditionCheckFailure !== 'ALL_OLD') throw error
        const found = await raw.send(new GetItemCommand({ TableName: table, Key: command.input.Key, ConsistentRead: true }))
        throw Object.assign(error as Error, { Item: found.Item })
      }
    })
    const store = new DynamoDbStore({ table, client, clock, clockSkew: 0 })
    expect(await store.acquire('returned', 'k', fp('b'), 10_000)).toEqual({ kind: 'mismatch' })
    expect(sent.filter((command) => command instanceof GetItemCommand)).toEqual([])
  })

  it('takes over an ended in-progress record that has no steps map (written before steps existed)', async () => {
    const now = clock.now()
    await raw.send(
      new PutItemCommand({
        TableName: table,
        Item: {
          pk: { S: 'idemkey#legacy\nk' },
          sc: { S: 'legacy' },
          k: { S: 'k' },
          fp: { S: fp('a') },
          st: { S: 'in_progress' },
          tok: { N: '3' },
          att: { N: '1' },
          lu: { N: String(now - 1) },
          ca: { N: String(now - 1_000) },
          ua: { N: String(now - 1_000) },
          ea: { N: String(now + DAY) },
        },
      }),
    )
    const store = new DynamoDbStore({ table, client: raw, clock, clockSkew: 0 })
    expect(await store.acquire('legacy', 'k', fp('b'), 10_000)).toEqual({ kind: 'acquired', token: 4 })
  })

  it('reports a failed write, read or takeover as STORE_UNAVAILABLE naming acquire, with the SDK error as cause', async () => {
    const start = clock.now()
    await other.acquire('failing', 'held', fp('a'), 10_000)
    await other.acquire('failing', 'ended', fp('a'), 1_000)
    clock.advance(1_000)
    const failOnce = (failing: (command: Command) => boolean) => {
      const throttled = sdkError('ThrottlingException')
      let failed = false
      const { client } = hooked((command, forward) => {
        if (failed || !failing(command)) return forward()
        failed = true
        return Promise.reject(throttled)
      })
      return { store: new DynamoDbStore({ table, client, clock, clockSkew: 0 }), throttled }
    }
    const cases = [
      { key: 'fresh', failing: (command: Command) => command instanceof UpdateItemCommand },
      { key: 'held', failing: (command: Command) => command instanceof GetItemCommand },
      {
        key: 'ended',
        failing: isTakeover,
      },
    ]
    for (const { key, failing } of cases) {
      const { store, throttled } = failOnce(failing)
      await expect(store.acquire('failing', key, fp('a'), 10_000)).rejects.toMatchObject({
        code: 'STORE_UNAVAILABLE',
        message: expect.stringContaining('dynamodb: acquire failed: ThrottlingException (injected)'),
        cause: throttled,
      })
    }
    expect(await other.get('failing', 'fresh')).toBeNull()
    expect(await other.get('failing', 'ended')).toMatchObject({ token: 1, lockedUntilMs: start + 1_000 })
  })

  it('fails with STORE_UNAVAILABLE when the endpoint returns no token from the write', async () => {
    const { client } = hooked(async (command, forward) => {
      const answer = await forward()
      return command instanceof UpdateItemCommand ? { ...answer, Attributes: undefined } : answer
    })
    await expect(new DynamoDbStore({ table, client, clock }).acquire('tokenless', 'k', fp('a'), 10_000)).rejects.toMatchObject({
      code: 'STORE_UNAVAILABLE',
      message: expect.stringContaining('acquire got no token back from the write'),
    })
  })
})

describe('DynamoDbStore.list and purgeExpired', () => {
  const clock = new ManualClock()

  it('refuses a negative or fractional limit, and answers limit 0 with no records without a scan', async () => {
    const store = new DynamoDbStore({ table: dynamo.table('rules-no-table'), client: raw, clock })
    for (const limit of [-1, 1.5, Number.NaN]) {
      await expect(store.list({ limit })).rejects.toEqual(
        expect.objectContaining({ code: 'INVALID_ARGUMENT', message: `list limit must be a non-negative integer, got ${String(limit)}.` }),
      )
    }
    expect(await store.list({ limit: 0 })).toEqual([])
  })

  it('lists every scope under its keyPrefix without a scope filter, and one scope with it, oldest first, then by scope, then by key', async () => {
    const table = dynamo.table('rules-list')
    const store = new DynamoDbStore({ table, client: raw, clock })
    await store.migrate()
    await raw.send(new PutItemCommand({ TableName: table, Item: { pk: { S: 'other#a\nk' }, note: { S: 'not a record' } } }))
    const order = [
      ['b', 'k2'],
      ['a', 'k3'],
      ['b', 'k1'],
      ['a', 'k1'],
      ['ab', 'k1'],
      ['a', 'k2'],
      ['b', 'k3'],
      ['ab', 'k0'],
    ] as const
    await store.acquire('z', 'first', fp('a'), 10_000)
    clock.advance(1)
    for (const [scope, key] of order) await store.acquire(scope, key, fp('a'), 10_000)
    clock.advance(1)
    await store.acquire('0', 'last', fp('a'), 10_000)
    const names = (records: { scope: string; key: string }[]) => records.map((record) => `${record.scope}/${record.key}`)
    expect(names(await store.list())).toEqual(['z/first', 'a/k1', 'a/k2', 'a/k3', 'ab/k0', 'ab/k1', 'b/k1', 'b/k2', 'b/k3', '0/last'])
    expect(names(await store.list({ scope: 'a' }))).toEqual(['a/k1', 'a/k2', 'a/k3'])
    expect(names(await store.list({ limit: 2 }))).toEqual(['z/first', 'a/k1'])
  })

  it('reads every page of a scan larger than 1 MB', async () => {
    const table = dynamo.table('rules-pages')
    const store = new DynamoDbStore({ table, client: raw, clock })
    await store.migrate()
    for (const key of ['p1', 'p2', 'p3', 'p4', 'p5']) {
      await store.acquire('pages', key, fp('a'), 10_000)
      await store.complete('pages', key, 1, outcome(new Uint8Array(300 * 1024).fill(3)), 60_000)
    }
    expect((await store.list()).map((record) => record.key)).toEqual(['p1', 'p2', 'p3', 'p4', 'p5'])
    clock.advance(60_000)
    expect(await store.purgeExpired(100)).toBe(5)
  })

  it('purges up to its limit, skipping expired items under the prefix that idemkey did not write', async () => {
    const table = dynamo.table('rules-purge')
    const store = new DynamoDbStore({ table, client: raw, clock })
    await store.migrate()
    const junk = { pk: { S: 'idemkey#junk' }, ea: { N: '0' } }
    await raw.send(new PutItemCommand({ TableName: table, Item: junk }))
    const expire = async (keys: string[]) => {
      for (const key of keys) {
        await store.acquire('purge', key, fp('a'), 1_000)
        await store.complete('purge', key, 1, sampleOutcome(), 1_000)
      }
      clock.advance(1_000)
    }
    await expire(['a', 'b', 'c'])
    expect(await store.purgeExpired(100)).toBe(3)
    expect(await rawItem(table, { pk: { S: 'idemkey#junk' } })).toEqual(junk)
    await raw.send(new DeleteItemCommand({ TableName: table, Key: { pk: junk.pk } }))
    await expire(['d', 'e', 'f'])
    expect(await store.purgeExpired(2)).toBe(2)
    expect(await store.purgeExpired(2)).toBe(1)
    expect(await store.list({ includeExpired: true })).toEqual([])
  })

  it('leaves a record acquired again between its scan and its delete, and reports a failed delete as STORE_UNAVAILABLE', async () => {
    const table = dynamo.table('rules-purge-race')
    const setup = new DynamoDbStore({ table, client: raw, clock })
    await setup.migrate()
    await setup.acquire('race', 'k', fp('a'), 1_000)
    await setup.complete('race', 'k', 1, sampleOutcome(), 1_000)
    clock.advance(1_000)
    const revived = hooked(async (command, forward) => {
      if (command.input.ConditionExpression === '#ea <= :now')
        expect((await setup.acquire('race', 'k', fp('b'), 10_000)).kind).toBe('acquired')
      return forward()
    })
    expect(await new DynamoDbStore({ table, client: revived.client, clock }).purgeExpired(10)).toBe(0)
    expect((await setup.get('race', 'k'))?.fingerprint).toBe(fp('b'))
    clock.advance(DAY + 10_000)
    const throttled = sdkError('ThrottlingException')
    const failing = hooked((command, forward) =>
      command.input.ConditionExpression === '#ea <= :now' ? Promise.reject(throttled) : forward(),
    )
    await expect(new DynamoDbStore({ table, client: failing.client, clock }).purgeExpired(10)).rejects.toMatchObject({
      code: 'STORE_UNAVAILABLE',
      message: expect.stringContaining('dynamodb: purgeExpired failed'),
      cause: throttled,
    })
  })
})

describe('DynamoDbStore errors and close()', () => {
  it('names the operation that found no table, with the SDK error as cause', async () => {
    const table = dynamo.table('rules-missing')
    const store = new DynamoDbStore({ table, client: raw })
    const missing = (operation: string) =>
      expect.objectContaining({
        code: 'STORE_SCHEMA',
        message: expect.stringContaining(`dynamodb: ${operation} found no table ${table}.`),
        cause: expect.objectContaining({ name: 'ResourceNotFoundException' }),
      })
    await expect(store.renew('s', 'k', 1, 1_000)).rejects.toEqual(missing('renew'))
    await expect(store.recordStep('s', 'k', 1, 'charge', '{}')).rejects.toEqual(missing('recordStep'))
    await expect(store.complete('s', 'k', 1, sampleOutcome(), 1_000)).rejects.toEqual(missing('complete'))
    await expect(store.release('s', 'k', 1)).rejects.toEqual(missing('release'))
    await expect(store.get('s', 'k')).rejects.toEqual(missing('get'))
    await expect(store.evict('s', 'k')).rejects.toEqual(missing('evict'))
    await expect(store.list()).rejects.toEqual(missing('list'))
    await expect(store.purgeExpired(10)).rejects.toEqual(missing('purgeExpired'))
  })

  it('destroys the client it made when closed (even one never used), and leaves a given client open', async () => {
    const destroy = vi.spyOn(DynamoDBClient.prototype, 'destroy')
    try {
      await new DynamoDbStore({ table: 'idemkey', clientConfig: ownClientConfig() }).close()
      expect(destroy).not.toHaveBeenCalled()
      const owning = new DynamoDbStore({ table: dynamo.table('rules-own'), clientConfig: ownClientConfig() })
      await owning.migrate()
      await owning.close()
      expect(destroy).toHaveBeenCalledTimes(1)
      await owning.close()
      expect(destroy).toHaveBeenCalledTimes(1)
      const given = { send: vi.fn(() => Promise.resolve({})), destroy: vi.fn() }
      await new DynamoDbStore({ table: 'idemkey', client: given }).close()
      expect(given.destroy).not.toHaveBeenCalled()
    } finally {
      destroy.mockRestore()
    }
  })
  it('keeps using a given client after close(), never one of its own made with the default config', async () => {
    const client = dynamo.client()
    const sent = vi.spyOn(client, 'send')
    const store = new DynamoDbStore({ table: dynamo.table('rules-given-after-close'), client, clock: new ManualClock(), clockSkew: 0 })
    await store.migrate()
    await store.close()
    const made = vi.spyOn(DynamoDBClient.prototype, 'send')
    try {
      const before = sent.mock.calls.length
      expect(await store.acquire('s', 'after-close', fp('a'), 10_000)).toEqual({ kind: 'acquired', token: 1 })
      expect(sent.mock.calls.length).toBeGreaterThan(before)
      expect(made).not.toHaveBeenCalled() // no client of the store's own
    } finally {
      made.mockRestore()
      sent.mockRestore()
    }
  })
})

describe.skipIf(dynamo.endpoint === undefined)('DynamoDbStore requestTimeout against a half-open connection (a TcpFaultProxy)', () => {
  const REQUEST_TIMEOUT_MS = 1_500

  it('fails a request unanswered past requestTimeout with STORE_UNAVAILABLE, destroys its socket, and sends the next on a new connection', async () => {
    const target = new URL(dynamo.endpoint as string)
    const proxy = await TcpFaultProxy.start({ host: target.hostname, port: Number(target.port) })
    const store = new DynamoDbStore({
      table: dynamo.table('rules-half-open'),
      requestTimeout: REQUEST_TIMEOUT_MS,
      clientConfig: { ...ownClientConfig(), endpoint: `http://127.0.0.1:${proxy.port}` },
    })
    try {
      await store.migrate()
      expect(await store.get('s', 'k')).toBeNull()
      proxy.blackhole()
      const error = await store.get('s', 'k').catch((caught: unknown) => caught)
      expect(error).toMatchObject({
        code: 'STORE_UNAVAILABLE',
        message: expect.stringContaining('dynamodb: get failed'),
        cause: {
          code: 'IDEMKEY_REQUEST_TIMEOUT',
          message: `no answer from DynamoDB within requestTimeout (${REQUEST_TIMEOUT_MS} ms); the request was abandoned and its connection dropped (half-open, or the endpoint is stalled)`,
        },
      })
      await eventually(() => proxy.localSockets() === 0, 'the abandoned socket closed', 5_000)
      // The stalled connection never answers again: the next request must go on a new one.
      proxy.heal({ stalled: 'hang' })
      expect(await store.get('s', 'k')).toBeNull()
    } finally {
      await store.close()
      await proxy.close()
    }
  }, 10_000)

  it('bounds every request by 10 s by default, takes a duration, and bounds nothing with 0', async () => {
    const signals: Array<AbortSignal | undefined> = []
    const client: DynamoDbClientLike = {
      send(_command, options) {
        signals.push((options as { abortSignal?: AbortSignal } | undefined)?.abortSignal)
        return Promise.resolve({})
      },
    }
    for (const requestTimeout of [undefined, '2s', 0] as const) {
      await new DynamoDbStore({ table: 'idemkey', client, requestTimeout }).get('s', 'k')
    }
    expect(signals.map((signal) => signal instanceof AbortSignal)).toEqual([true, true, false])
    expect(thrown(() => new DynamoDbStore({ table: 'idemkey', requestTimeout: '25d' }))).toMatchObject({
      code: 'INVALID_OPTION',
      message: expect.stringMatching(/^requestTimeout "25d" is longer than 24\.8 days/),
    })
    expect(thrown(() => new DynamoDbStore({ table: 'idemkey', requestTimeout: 'soon' }))).toMatchObject({
      code: 'INVALID_OPTION',
      message: expect.stringContaining('requestTimeout'),
    })
  })
})

describe('DynamoDbStore without @aws-sdk/client-dynamodb, in this process', () => {
  it('fails with INVALID_OPTION naming npm i @aws-sdk/client-dynamodb, the import error as cause, and tries again next time', async () => {
    const missing = Object.assign(new Error("Cannot find package '@aws-sdk/client-dynamodb'"), { code: 'ERR_MODULE_NOT_FOUND' })
    vi.resetModules()
    vi.doMock('@aws-sdk/client-dynamodb', () => {
      throw missing
    })
    try {
      const { loadSdk } = await import('./client.js')
      const first = await loadSdk().then(
        () => undefined,
        (error: unknown) => error,
      )
      expect(first).toMatchObject({ code: 'INVALID_OPTION', message: expect.stringContaining('npm i @aws-sdk/client-dynamodb') })
      // The import's failure, as vitest reports a module it cannot load (the package's absence wrapped once).
      expect(((first as Error).cause as Error).cause).toBe(missing)
      vi.doUnmock('@aws-sdk/client-dynamodb')
      await expect(loadSdk()).resolves.toHaveProperty('GetItemCommand')
    } finally {
      vi.doUnmock('@aws-sdk/client-dynamodb')
      vi.resetModules()
    }
  })
})
