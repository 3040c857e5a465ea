/**
 * close() lets the calls made before it finish: an outcome whose complete() was called before a
 * shutdown hook closed the store is stored, not failed with STORE_UNAVAILABLE. On SQLite the calls of
 * the current event-loop turn wait for their group commit; on PostgreSQL and MySQL, calls queued behind
 * a group-commit batch in flight wait for the next batch.
 */
import { randomBytes } from 'node:crypto'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { afterAll, describe, expect, it } from 'vitest'
import { MySqlStore } from '../src/backends/mysql/mysql-store.js'
import { PostgresStore } from '../src/backends/postgres/index.js'
import { SqliteStore } from '../src/backends/sqlite/sqlite-store.js'
import type { IdempotencyStore } from '../src/core/store.js'
import { fp, sampleOutcome } from '../src/testing/index.js'
import { serviceSkipReason } from './helpers/services.js'

const dir = mkdtempSync(join(tmpdir(), 'idemkey-close-in-flight-'))
afterAll(() => rmSync(dir, { recursive: true, force: true }))
const suffix = randomBytes(4).toString('hex')
const pgSkip = await serviceSkipReason('PostgreSQL', 5432)
const mySkip = await serviceSkipReason('MariaDB', 3306)

/** Acquires `n` keys, then calls complete on each and close() in the same turn; returns what each complete answered. */
async function completeThenClose(store: IdempotencyStore, scope: string, n: number): Promise<PromiseSettledResult<boolean>[]> {
  const tokens: number[] = []
  for (let i = 0; i < n; i++) {
    const acquired = await store.acquire(scope, `k${i}`, fp('a'), 60_000)
    if (acquired.kind !== 'acquired') throw new Error(`expected acquired, got ${acquired.kind}`)
    tokens.push(acquired.token)
  }
  const completing = Promise.allSettled(tokens.map((token, i) => store.complete(scope, `k${i}`, token, sampleOutcome(), 60_000)))
  await store.close()
  return completing
}

describe('close() with calls in flight', () => {
  it('sqlite: stores the outcomes whose complete() was called before close()', async () => {
    const path = join(dir, 'close.db')
    const results = await completeThenClose(new SqliteStore({ path }), 'close', 3)
    expect(results).toEqual(results.map(() => ({ status: 'fulfilled', value: true })))
    const reopened = new SqliteStore({ path })
    expect((await reopened.get('close', 'k0'))?.status).toBe('completed')
    await reopened.close()
  })

  it.skipIf(pgSkip !== undefined)('postgres: answers the calls queued behind a group-commit batch before ending the pool', async () => {
    const options = { connectionString: 'postgres://root@127.0.0.1:5432/test', table: `close_in_flight_${suffix}` }
    const setup = new PostgresStore(options)
    await setup.migrate()
    await setup.close()
    const results = await completeThenClose(new PostgresStore(options), 'close', 4)
    expect(results).toEqual(results.map(() => ({ status: 'fulfilled', value: true })))
  })

  it.skipIf(mySkip !== undefined)('mysql: answers the calls queued behind a group-commit batch before ending the pool', async () => {
    const options = { uri: 'mysql://root@127.0.0.1:3306/test', table: `close_in_flight_${suffix}` }
    const setup = new MySqlStore(options)
    await setup.migrate()
    await setup.close()
    const results = await completeThenClose(new MySqlStore(options), 'close', 4)
    expect(results).toEqual(results.map(() => ({ status: 'fulfilled', value: true })))
  })
})
