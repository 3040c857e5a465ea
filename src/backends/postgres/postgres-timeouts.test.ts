import { describe, expect, it } from 'vitest'
import type { PgPoolLike, PgQueryConfig } from './pool.js'
import { PostgresStore } from './postgres-store.js'

/** A pool that answers every statement with no rows and keeps what it was sent. */
function recordingPool(): { pool: PgPoolLike; sent: PgQueryConfig[] } {
  const sent: PgQueryConfig[] = []
  const query = async (config: PgQueryConfig | string, values?: unknown[]) => {
    sent.push(typeof config === 'string' ? { text: config, values } : config)
    return { rows: [], rowCount: 0 }
  }
  const pool = { query, connect: async () => ({ query, release: () => {} }) } as unknown as PgPoolLike
  return { pool, sent }
}

describe('PostgresStore queryTimeout', () => {
  it('bounds every statement sent on the pool by 10 s by default, so a half-open connection cannot hold a slot for ever', async () => {
    const { pool, sent } = recordingPool()
    const store = new PostgresStore({ pool, notifications: false })
    expect(await store.get('s', 'k')).toBeNull()
    await store.list({ scope: 's' })
    expect(sent.map((config) => config.query_timeout)).toEqual([10_000, 10_000])
  })

  it('takes a duration, and leaves statements inside your transaction unbounded', async () => {
    const { pool, sent } = recordingPool()
    const store = new PostgresStore({ pool, notifications: false, queryTimeout: '2s', groupCommit: false })
    await store.get('s', 'k')
    await store.transaction(async (tx) => {
      await store.recordStepInTransaction(tx, 's', 'k', 1, 'step', null)
    })
    const step = sent.find((config) => config.text.includes('steps'))
    expect(sent[0]?.query_timeout).toBe(2_000)
    expect(step).toBeDefined()
    expect(step?.query_timeout).toBeUndefined()
  })
})
