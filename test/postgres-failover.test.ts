/**
 * PostgreSQL failover under load: what a promotion of a streaming standby loses, counted.
 *
 * A primary and a streaming standby (test/fixtures/postgres/replicated-pair.ts), the standby 10 ms away
 * each way. Clients reach "the primary" through a TCP forwarder standing for a virtual IP / DNS name /
 * PgBouncer, which the test repoints at the promoted standby. Sixteen callers run the Ledger as a user
 * does (`ledger.run` through a `PostgresStore` on its own pool): new keys, duplicates of keys already
 * answered, concurrent duplicates, and retries of every call that got no answer. At a random moment
 * each round kills the primary with kill -9 (postmaster and backends at once), promotes the standby,
 * counts, lets the callers in, and builds a new standby with pg_basebackup for the next round. Every
 * other round the standby is partitioned from the primary for 50-250 ms before the kill.
 *
 * Counted, exactly:
 *  - acknowledged: a call answered `executed`/`completed` or `replayed` (the caller was told "done").
 *  - lost: an acknowledged key whose completed record the promoted standby does not hold, read on it
 *    before any caller reaches it.
 *  - double: an execution of the work (counted in this process, outside the database) for a key after
 *    a call for that key was acknowledged. (A retry of a call that got no answer may run the work again:
 *    that is the at-least-once window of any store, docs/ledger.md, and not counted.)
 * Asynchronous streaming: counts reported (and some loss expected: that is what proves the counting
 * sees loss when nothing waits for the standby). `durability: { synchronousCommit: 'on' | 'remote_apply' }`
 * with `synchronous_standby_names = '*'`: 0 lost and 0 doubles over 20 failovers (10 per level).
 * The same topology with sessions at `synchronous_commit = local` (the wait removed) loses records again.
 * IDEMKEY_FAILOVER_SOAK=1 runs 50 rounds of each.
 */
import pg from 'pg'
import { PostgresDurabilityError, PostgresStore, type SynchronousCommit } from '../src/backends/postgres/index.js'
import { Ledger } from '../src/core/ledger.js'
import { canStartReplicatedPair, type ReplicatedPair, startReplicatedPair } from './fixtures/postgres/replicated-pair.js'
import { isCI } from './helpers/services.js'

const SOAK = process.env.IDEMKEY_FAILOVER_SOAK === '1'
const SYNC_ROUNDS = SOAK ? 50 : 10
const ASYNC_ROUNDS = SOAK ? 50 : 4
const CALLERS = 16
const LINK_DELAY_MS = 10
const reason = canStartReplicatedPair()
  ? undefined
  : 'the PostgreSQL 15 binaries (initdb, pg_ctl, pg_basebackup) are not in /usr/lib/postgresql/15/bin'
if (reason && isCI()) throw new Error(`CI=${process.env.CI} and ${reason}`)
if (reason) console.warn(`\n!!! SKIPPED: PostgreSQL failover: ${reason}\n`)

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

interface Counts {
  rounds: number
  acknowledged: number
  lost: number
  doubles: number
  executions: number
  unanswered: number
}

/** Callers running the ledger in a loop, and what they were told. */
class Load {
  readonly acked = new Set<string>()
  readonly lostKeys = new Set<string>()
  /** Executions of the work per key: the effect, counted outside the database. */
  readonly effects = new Map<string, number>()
  doubles = 0
  unanswered = 0
  #pending: string[] = []
  #fresh = 0
  #running = true
  #workers: Promise<void>[] = []

  constructor(readonly ledger: Ledger) {
    for (let i = 0; i < CALLERS; i++) this.#workers.push(this.#worker())
  }

  #pick(): string {
    const roll = Math.random()
    if (roll < 0.3 && this.#pending.length > 0) return this.#pending.shift() as string
    if (roll < 0.55 && this.acked.size > 0) {
      const keys = [...this.acked]
      return keys[Math.floor(Math.random() * keys.length)] as string
    }
    // Now and then a key another caller may be running at this moment.
    if (roll < 0.65 && this.#fresh > 0) return `k${this.#fresh - 1 - Math.floor(Math.random() * Math.min(this.#fresh, 4))}`
    return `k${this.#fresh++}`
  }

  async #worker(): Promise<void> {
    while (this.#running) {
      const key = this.#pick()
      try {
        const result = await this.ledger.run({ key, payload: { key } }, async () => {
          if (this.acked.has(key)) this.doubles++
          this.effects.set(key, (this.effects.get(key) ?? 0) + 1)
          await sleep(Math.random() * 3)
          return `done ${key}`
        })
        if ((result.kind === 'executed' && result.outcome === 'completed') || result.kind === 'replayed') {
          expect(result.value).toBe(`done ${key}`)
          this.acked.add(key)
        } else {
          this.unanswered++
          this.#pending.push(key)
        }
      } catch {
        this.unanswered++
        this.#pending.push(key)
        await sleep(20)
      }
    }
  }

  /** Acknowledged keys the server at `url` has no completed record of, counted once each. */
  async countLost(url: string): Promise<number> {
    const keys = [...this.acked]
    const client = new pg.Client({ connectionString: url })
    await client.connect()
    try {
      const { rows } = await client.query(
        `SELECT key FROM idemkey_records WHERE scope = 'default' AND status = 'completed' AND key = ANY($1)`,
        [keys],
      )
      const present = new Set(rows.map((row: { key: string }) => row.key))
      let lost = 0
      for (const key of keys) {
        if (present.has(key) || this.lostKeys.has(key)) continue
        this.lostKeys.add(key)
        lost++
      }
      return lost
    } finally {
      await client.end()
    }
  }

  async stop(): Promise<void> {
    this.#running = false
    await Promise.all(this.#workers)
  }
}

/** Runs `rounds` failovers under load; returns the counts. */
async function failovers(pair: ReplicatedPair, store: PostgresStore, rounds: number, label: string): Promise<Counts> {
  const ledger = new Ledger({ store, lease: '1s', wait: '2s', storeTimeout: '3s', ttl: '1h' })
  const load = new Load(ledger)
  try {
    for (let round = 0; round < rounds; round++) {
      // A random moment of steady load, once some keys are answered.
      await sleep(250 + Math.random() * 500)
      // Every other round the standby is cut off first, for a random while (a partition, or a standby
      // fallen behind): the primary goes on answering only if nothing waits for the standby.
      if (round % 2 === 1) {
        pair.partitionStandby()
        await sleep(50 + Math.random() * 200)
      }
      await pair.crashPrimary()
      await pair.promote()
      // The acknowledgements are read after the kill: none can arrive from the dead primary now.
      const lost = await load.countLost(pair.primaryUrl())
      pair.vip.heal()
      if (lost > 0) console.log(`${label}: round ${round + 1}: ${lost} acknowledged records lost`)
      await pair.rebuildStandby()
    }
    await sleep(300)
  } finally {
    await load.stop()
  }
  // The final primary holds every acknowledged key (a key lost and answered again counts once, above).
  await load.countLost(pair.primaryUrl())
  const executions = [...load.effects.values()].reduce((sum, n) => sum + n, 0)
  const counts = {
    rounds,
    acknowledged: load.acked.size,
    lost: load.lostKeys.size,
    doubles: load.doubles,
    executions,
    unanswered: load.unanswered,
  }
  console.log(`${label}: ${JSON.stringify(counts)}`)
  return counts
}

function storeOn(
  pair: ReplicatedPair,
  synchronousCommit: SynchronousCommit,
  onMismatch: 'refuse' | 'warn' = 'refuse',
  warn?: (m: string) => void,
) {
  return new PostgresStore({
    connectionString: pair.url,
    max: 8,
    connectionTimeout: '1s',
    queryTimeout: '3s',
    durability: { synchronousCommit, onMismatch, ...(warn ? { warn } : {}) },
  })
}

describe.skipIf(reason !== undefined)('PostgreSQL failover with an asynchronous standby', () => {
  let pair: ReplicatedPair
  beforeAll(async () => {
    pair = await startReplicatedPair({ linkDelayMs: LINK_DELAY_MS })
    const setup = new PostgresStore({ connectionString: pair.url, max: 1 })
    await setup.migrate()
    await setup.close()
  }, 60_000)
  afterAll(async () => {
    await pair?.destroy()
  })

  it('refuses durability with PostgresDurabilityError naming synchronous_standby_names', async () => {
    const store = storeOn(pair, 'on')
    try {
      const error = await store.get('default', 'k').catch((e: unknown) => e)
      expect(error).toBeInstanceOf(PostgresDurabilityError)
      expect((error as PostgresDurabilityError).problems.map((p) => p.setting)).toEqual(['synchronous_standby_names'])
    } finally {
      await store.close()
    }
  })

  it('loses acknowledged records on promotion, and runs their effects again (counts reported)', async () => {
    const warnings: string[] = []
    const store = storeOn(pair, 'on', 'warn', (message) => warnings.push(message))
    try {
      const counts = await failovers(pair, store, ASYNC_ROUNDS, 'async standby')
      expect(warnings).toHaveLength(1)
      expect(counts.acknowledged).toBeGreaterThan(100)
      // The same counting as the synchronous suites below finds loss here: nothing waits for the standby.
      expect(counts.lost).toBeGreaterThan(0)
    } finally {
      await store.close()
    }
  }, 120_000)
})

describe.skipIf(reason !== undefined).each(['on', 'remote_apply'] as const)(
  'PostgreSQL failover with a synchronous standby, durability { synchronousCommit: %s }',
  (level) => {
    let pair: ReplicatedPair
    beforeAll(async () => {
      pair = await startReplicatedPair({ linkDelayMs: LINK_DELAY_MS, synchronousStandbyNames: '*' })
      const setup = new PostgresStore({ connectionString: pair.url, max: 1 })
      await setup.migrate()
      await setup.close()
    }, 60_000)
    afterAll(async () => {
      await pair?.destroy()
    })

    it('refuses, naming GRANT pg_monitor, a role that cannot read pg_stat_replication.sync_state', async () => {
      const admin = new pg.Client({ connectionString: pair.primaryUrl() })
      await admin.connect()
      await admin.query(`DROP ROLE IF EXISTS idemkey_app; CREATE ROLE idemkey_app LOGIN`)
      await admin.end()
      const pool = new pg.Pool({ connectionString: pair.url.replace('postgres@', 'idemkey_app@'), max: 1 })
      const store = new PostgresStore({ pool, durability: { synchronousCommit: level } })
      try {
        const error = (await store.get('default', 'k').catch((e: unknown) => e)) as PostgresDurabilityError
        expect(error).toBeInstanceOf(PostgresDurabilityError)
        // (At remote_apply the role's default synchronous_commit, on, is named too.)
        expect(error.problems.map((p) => p.fix)).toContain('GRANT pg_monitor TO "idemkey_app"')
      } finally {
        await pool.end()
      }
    })

    it(`loses no acknowledged record and runs no acknowledged effect twice over ${SYNC_ROUNDS} kill -9 failovers`, async () => {
      const warnings: string[] = []
      const store = storeOn(pair, level, 'warn', (message) => warnings.push(message))
      try {
        const counts = await failovers(pair, store, SYNC_ROUNDS, `sync standby, synchronous_commit=${level}`)
        // The check found what it asks for: it warned of nothing.
        expect(warnings).toEqual([])
        expect(counts.acknowledged).toBeGreaterThan(100)
        expect({ lost: counts.lost, doubles: counts.doubles }).toEqual({ lost: 0, doubles: 0 })
      } finally {
        await store.close()
      }
    }, 400_000)
  },
)

describe.skipIf(reason !== undefined)(
  'PostgreSQL failover with a synchronous standby but sessions that commit locally (the wait removed)',
  () => {
    let pair: ReplicatedPair
    let pool: pg.Pool
    beforeAll(async () => {
      pair = await startReplicatedPair({ linkDelayMs: LINK_DELAY_MS, synchronousStandbyNames: '*' })
      pool = new pg.Pool({ connectionString: pair.url, max: 8, connectionTimeoutMillis: 1_000, options: '-c synchronous_commit=local' })
      pool.on('error', () => {})
      await new PostgresStore({ pool }).migrate()
    }, 60_000)
    afterAll(async () => {
      await pool?.end()
      await pair?.destroy()
    })

    it('loses acknowledged records, and the check had named synchronous_commit', async () => {
      const warnings: string[] = []
      const warn = (message: string) => warnings.push(message)
      const store = new PostgresStore({ pool, queryTimeout: '3s', durability: { synchronousCommit: 'on', onMismatch: 'warn', warn } })
      const counts = await failovers(pair, store, ASYNC_ROUNDS, 'sync standby, synchronous_commit=local')
      expect(warnings).toHaveLength(1)
      expect(warnings[0]).toContain("synchronous_commit is 'local' in this session")
      expect(counts.lost).toBeGreaterThan(0)
    }, 120_000)
  },
)
