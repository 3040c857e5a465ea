import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { type DynamoDbEndpoint, startDynamoDb } from '../../../test/helpers/dynalite.js'
import { openStore } from '../../cli/store-url.js'
import { ManualClock } from '../../core/clock.js'
import { describeStore, describeStoreModel, fp, sampleOutcome } from '../../testing/index.js'
import { DynamoDbStore } from './index.js'

// The shared contract and the model test, against dynalite on a loopback port (or the endpoint in
// IDEMKEY_DYNAMODB_ENDPOINT). Leases run on the injected clock, so no skew margin here.
const dynamo: DynamoDbEndpoint = await startDynamoDb()
afterAll(() => dynamo.stop())

async function migrated(store: DynamoDbStore): Promise<DynamoDbStore> {
  await store.migrate()
  return store
}

describeStore('dynamodb (your client)', ({ clock }) =>
  migrated(new DynamoDbStore({ table: dynamo.table('contract'), client: dynamo.client(), clock, clockSkew: 0 })),
)

describeStore('dynamodb (single-table: sort key and own attribute names)', ({ clock }) =>
  migrated(
    new DynamoDbStore({
      table: dynamo.table('single'),
      client: dynamo.client(),
      clock,
      clockSkew: 0,
      attributes: { partitionKey: 'PK', sortKey: 'SK', ttl: 'expires' },
      keyPrefix: 'IDEM#',
      sortKeyValue: 'IDEMPOTENCY',
    }),
  ),
)

describeStoreModel(
  'dynamodb',
  ({ clock }) => migrated(new DynamoDbStore({ table: dynamo.table('model'), client: dynamo.client(), clock, clockSkew: 0 })),
  {
    numRuns: 150,
  },
)

describe('DynamoDbStore specifics', () => {
  const clock = new ManualClock()
  let store: DynamoDbStore
  beforeAll(async () => {
    store = new DynamoDbStore({ table: dynamo.table('specific'), client: dynamo.client(), clock, clockSkew: '1s' })
    await store.migrate()
  })

  it('takes a lease over only once it ended longer ago than clockSkew, and reports the lease end plus the skew', async () => {
    const first = await store.acquire('skew', 'k', fp('a'), 10_000)
    expect(first).toEqual({ kind: 'acquired', token: 1 })
    const start = clock.now()
    clock.advance(10_500)
    expect(await store.acquire('skew', 'k', fp('a'), 10_000)).toEqual({ kind: 'in_progress', lockedUntilMs: start + 11_000 })
    clock.advance(501)
    expect(await store.acquire('skew', 'k', fp('a'), 10_000)).toEqual({ kind: 'acquired', token: 2 })
  })

  it('stores a response too large for a 400 KB item without its body, naming the original length', async () => {
    const acquired = await store.acquire('big', 'k', fp('a'), 10_000)
    expect(acquired.kind).toBe('acquired')
    const body = new Uint8Array(500 * 1024).fill(7)
    const outcome = sampleOutcome('completed', body)
    expect(await store.complete('big', 'k', 1, outcome, 60_000)).toBe(true)
    const replay = await store.acquire('big', 'k', fp('a'), 10_000)
    if (replay.kind !== 'replay') throw new Error(`expected a replay, got ${replay.kind}`)
    expect(replay.record.response?.status).toBe(201)
    expect(replay.record.response?.body.byteLength).toBe(0)
    expect(replay.record.response?.headers).toMatchObject({ location: '/orders/42', 'idempotent-body-omitted': String(500 * 1024) })
  })

  it('keeps a body just under the item limit', async () => {
    await store.acquire('fits', 'k', fp('a'), 10_000)
    const body = new Uint8Array(300 * 1024).fill(9)
    expect(await store.complete('fits', 'k', 1, sampleOutcome('completed', body), 60_000)).toBe(true)
    expect((await store.get('fits', 'k'))?.response?.body).toEqual(body)
  })

  it('migrates twice without complaint, and refuses a table whose keys differ from the configured ones', async () => {
    await store.migrate()
    const other = new DynamoDbStore({ table: store.table, client: dynamo.client(), attributes: { partitionKey: 'PK', sortKey: 'SK' } })
    await expect(other.migrate()).rejects.toMatchObject({ code: 'STORE_SCHEMA', message: expect.stringContaining('key schema') })
  })

  it('reports a missing table as STORE_SCHEMA naming store.migrate()', async () => {
    const missing = new DynamoDbStore({ table: dynamo.table('absent'), client: dynamo.client() })
    await expect(missing.acquire('s', 'k', fp('a'), 1_000)).rejects.toMatchObject({
      code: 'STORE_SCHEMA',
      message: expect.stringContaining('store.migrate()'),
    })
  })

  it('reports an unreachable endpoint as STORE_UNAVAILABLE', async () => {
    const down = new DynamoDbStore({
      table: 'idemkey',
      clientConfig: {
        endpoint: 'http://127.0.0.1:1',
        region: 'us-east-1',
        credentials: { accessKeyId: 'x', secretAccessKey: 'x' },
        maxAttempts: 1,
      },
    })
    await expect(down.get('s', 'k')).rejects.toMatchObject({
      code: 'STORE_UNAVAILABLE',
      message: expect.stringContaining('dynamodb: get failed'),
    })
    await down.close()
  })

  it('refuses options that cannot work, saying what to pass', () => {
    expect(() => new DynamoDbStore({ table: '' })).toThrow(/needs \{ table \}/)
    expect(() => new DynamoDbStore({ table: 'idemkey', attributes: { partitionKey: 'tok' } })).toThrow(/not usable/)
    expect(() => new DynamoDbStore({ table: 'idemkey', attributes: { partitionKey: 'x', ttl: 'x' } })).toThrow(/must differ/)
  })
})

describe('dynamodb:// store URLs (the CLI)', () => {
  it('opens dynamodb://TABLE with the region and endpoint of its query, migrates it and keeps records there', async () => {
    if (dynamo.endpoint === undefined) return // the real service: covered by the suites above
    const saved = { id: process.env.AWS_ACCESS_KEY_ID, secret: process.env.AWS_SECRET_ACCESS_KEY }
    process.env.AWS_ACCESS_KEY_ID ??= 'test'
    process.env.AWS_SECRET_ACCESS_KEY ??= 'test'
    const table = dynamo.table('url')
    const opened = await openStore(`dynamodb://${table}?region=us-east-1&endpoint=${encodeURIComponent(dynamo.endpoint)}&prefix=cli%23`)
    try {
      expect(opened.spec.kind).toBe('dynamodb')
      expect(await opened.migrate()).toContain(`dynamodb://${table}`)
      expect(await opened.store.acquire('s', 'k', fp('a'), 1_000)).toEqual({ kind: 'acquired', token: 1 })
      const direct = new DynamoDbStore({ table, client: dynamo.client(), keyPrefix: 'cli#' })
      expect((await direct.get('s', 'k'))?.status).toBe('in_progress')
    } finally {
      await opened.store.close()
      if (saved.id === undefined) delete process.env.AWS_ACCESS_KEY_ID
      if (saved.secret === undefined) delete process.env.AWS_SECRET_ACCESS_KEY
    }
  })
})
