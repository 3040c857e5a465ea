/**
 * The guarantees of `ledger.runInTransaction` through a data-layer tool (issue 25, docs/orm.md), run
 * per tool and database against the real servers: what the raw pg/mysql2 path promises must hold when
 * the transaction is the tool's.
 */
import { type ChildProcess, spawn } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import mysql from 'mysql2/promise'
import pg from 'pg'
import { isTransientTransactionError as isTransientMySql, MySqlStore } from '../../src/backends/mysql/index.js'
import { isTransientTransactionError as isTransientPg, PostgresStore } from '../../src/backends/postgres/index.js'
import { Ledger } from '../../src/core/ledger.js'
import type { TransactionalStore } from '../../src/core/store.js'
import { InboxMismatchError, MySqlInbox, PgInbox } from '../../src/messaging/inbox/index.js'
import { MySqlOutbox, PgOutbox } from '../../src/messaging/outbox/index.js'
import { answeredWith } from './final-answers.js'
import { PRISMA_TABLES } from './orm-prisma.js'
import { type BusinessTables, type Dialect, MYSQL_URL, PG_URL, type ToolHarness, type ToolName, toolHarness } from './orm-tools.js'
import { paused } from './paused-store.js'
import { serviceSkipReason } from './services.js'

const WORKER = join(dirname(fileURLToPath(import.meta.url)), '../fixtures/orm/worker.ts')

/** A store on the tool's transactions, and the raw connection the test reads the business tables with. */
export interface ToolSetup {
  harness: ToolHarness
  store: TransactionalStore<unknown> & { migrate(): Promise<void> }
  rows(sql: string, values: unknown[]): Promise<Record<string, unknown>[]>
  close(): Promise<void>
}

/** Builds the store of one tool on one database (the SIGKILL fixture builds it the same way). */
export async function toolSetup(tool: ToolName, dialect: Dialect, table: string, tables: BusinessTables): Promise<ToolSetup> {
  const harness = await toolHarness(tool, dialect, tables)
  if (dialect === 'postgres') {
    const pool = new pg.Pool({ connectionString: PG_URL, max: 4 })
    const store = new PostgresStore({ pool, table, transactions: harness.transactions })
    return {
      harness,
      store: store as never,
      rows: async (sql, values) => (await pool.query(sql, values)).rows,
      close: async () => {
        await store.close()
        await harness.close()
        await pool.end()
      },
    }
  }
  const pool = mysql.createPool({ uri: MYSQL_URL, connectionLimit: 4 })
  const store = new MySqlStore({ pool, table, transactions: harness.transactions })
  return {
    harness,
    store: store as never,
    rows: async (sql, values) => (await pool.query(sql.replace(/\$\d+/g, '?'), values as never[]))[0] as Record<string, unknown>[],
    close: async () => {
      await store.close()
      await harness.close()
      await pool.end()
    },
  }
}

function gate() {
  let open = () => {}
  const opened = new Promise<void>((resolve) => {
    open = resolve
  })
  return { open, opened }
}

/**
 * The five guarantees of issue 25, item 2, for one tool on one database. Needs the server; skips loudly
 * without it (and fails in CI).
 */
export async function describeToolTransactions(tool: ToolName, dialect: Dialect): Promise<void> {
  const skip = dialect === 'postgres' ? await serviceSkipReason('PostgreSQL', 5432) : await serviceSkipReason('MariaDB/MySQL', 3306)
  const suffix = randomUUID().slice(0, 8)
  const table = `idemkey_orm_${suffix}`
  const tables: BusinessTables =
    tool === 'prisma' ? PRISMA_TABLES : { orders: `idemkey_orm_orders_${suffix}`, accounts: `idemkey_orm_accounts_${suffix}` }
  const isTransient = dialect === 'postgres' ? isTransientPg : isTransientMySql
  const q = (name: string) => (dialect === 'postgres' ? `"${name}"` : `\`${name}\``)

  describe.skipIf(skip !== undefined)(`${tool} on ${dialect}: runInTransaction through the tool's own transaction`, () => {
    let setup: ToolSetup
    const orderRows = async (key: string) =>
      (await setup.rows(`SELECT who FROM ${q(tables.orders)} WHERE intent = $1 ORDER BY who`, [key])).map((r) => String(r.who))

    beforeAll(async () => {
      setup = await toolSetup(tool, dialect, table, tables)
      await setup.store.migrate()
      const serial = dialect === 'postgres' ? 'serial PRIMARY KEY' : 'int AUTO_INCREMENT PRIMARY KEY'
      await setup.rows(`DROP TABLE IF EXISTS ${q(tables.orders)}`, [])
      await setup.rows(`DROP TABLE IF EXISTS ${q(tables.accounts)}`, [])
      await setup.rows(`CREATE TABLE ${q(tables.orders)} (id ${serial}, intent varchar(200) NOT NULL, who varchar(50) NOT NULL)`, [])
      await setup.rows(`CREATE TABLE ${q(tables.accounts)} (id varchar(200) PRIMARY KEY, balance integer NOT NULL)`, [])
    }, 60_000)
    afterAll(async () => {
      if (!setup) return
      await setup.rows(`DROP TABLE IF EXISTS ${q(table)}`, [])
      if (dialect === 'mysql') await setup.rows(`DROP TABLE IF EXISTS ${q(`${table}_meta`)}`, [])
      await setup.rows(`DROP TABLE IF EXISTS ${q(tables.orders)}`, [])
      await setup.rows(`DROP TABLE IF EXISTS ${q(tables.accounts)}`, [])
      await setup.close()
    })

    it('concurrent duplicates produce one business row, committed with the completed record', async () => {
      const ledger = new Ledger({ store: setup.store, wait: 10_000 })
      const key = `order-${randomUUID()}`
      let runs = 0
      const results = await Promise.all(
        Array.from({ length: 6 }, () =>
          ledger.runInTransaction({ key, payload: { total: 42 } }, async ({ tx }) => {
            runs++
            await setup.harness.insertOrder(tx, key, 'first')
            return { orderId: key }
          }),
        ),
      )
      expect(runs).toBe(1)
      expect(results.filter((r) => r.kind === 'executed')).toHaveLength(1)
      expect(results.every((r) => r.kind === 'executed' || r.kind === 'replayed')).toBe(true)
      expect(results.map((r) => ('value' in r ? r.value : r.kind))).toEqual(Array.from({ length: 6 }, () => ({ orderId: key })))
      expect(await orderRows(key)).toEqual(['first'])
      expect((await setup.store.get('default', key))?.status).toBe('completed')
    })

    it('a replay returns the stored outcome without opening a business transaction', async () => {
      const { transactions } = setup.harness
      let opened = 0
      const counted: typeof transactions = {
        ...transactions,
        transaction: (fn) => {
          opened++
          return transactions.transaction(fn)
        },
      }
      const store =
        dialect === 'postgres'
          ? new PostgresStore({ connectionString: PG_URL, table, notifications: false, transactions: counted })
          : new MySqlStore({ uri: MYSQL_URL, table, transactions: counted })
      const ledger = new Ledger({ store })
      const key = `order-${randomUUID()}`
      try {
        const work = async ({ tx }: { tx: unknown }) => {
          await setup.harness.insertOrder(tx, key, 'once')
          return { orderId: key, at: 'first run' }
        }
        expect(await ledger.runInTransaction({ key, payload: 1 }, work)).toMatchObject({ kind: 'executed', outcome: 'completed' })
        expect(opened).toBe(1)
        const replay = await ledger.runInTransaction({ key, payload: 1 }, work)
        expect(replay).toMatchObject({ kind: 'replayed', value: { orderId: key, at: 'first run' } })
        expect(opened).toBe(1)
        expect(await orderRows(key)).toEqual(['once'])
      } finally {
        await store.close()
      }
    })

    it('rolls back the business write when the work throws, and releases the record so the retry runs once', async () => {
      const ledger = new Ledger({ store: setup.store })
      const key = `order-${randomUUID()}`
      await expect(
        ledger.runInTransaction({ key, payload: 1 }, async ({ tx }) => {
          await setup.harness.insertOrder(tx, key, 'failed')
          throw new Error('card declined by a flaky gateway')
        }),
      ).rejects.toThrow('flaky gateway')
      expect(await orderRows(key)).toEqual([])
      const retry = await ledger.runInTransaction({ key, payload: 1 }, async ({ tx, token }) => {
        await setup.harness.insertOrder(tx, key, 'retry')
        return token
      })
      expect(retry).toMatchObject({ kind: 'executed', outcome: 'completed', value: 2 })
      expect(await orderRows(key)).toEqual(['retry'])
    })

    it("a returned final answer (422 out of stock) rolls back the work's writes and stores the answer, replayed without running again", async () => {
      const ledger = new Ledger({ store: setup.store })
      const key = `order-${randomUUID()}`
      let runs = 0
      const declined = async ({ tx }: { tx: unknown }) => {
        runs++
        await setup.harness.insertOrder(tx, key, 'declined')
        return { error: 'out of stock' }
      }
      expect(await ledger.runInTransaction({ key, payload: 1 }, declined, answeredWith(422))).toMatchObject({
        kind: 'executed',
        outcome: 'failed',
      })
      expect(await orderRows(key)).toEqual([])
      expect(await setup.store.get('default', key)).toMatchObject({ status: 'failed', response: { status: 422 } })
      const again = await ledger.runInTransaction({ key, payload: 1 }, declined, answeredWith(422))
      expect(again).toMatchObject({ kind: 'replayed', value: { error: 'out of stock' } })
      expect(runs).toBe(1)
    })

    it("with failedWrites: 'commit', a returned final answer commits the work's writes with the stored answer", async () => {
      const ledger = new Ledger({ store: setup.store })
      const key = `order-${randomUUID()}`
      const result = await ledger.runInTransaction(
        { key, payload: 1 },
        async ({ tx }) => {
          await setup.harness.insertOrder(tx, key, 'audit')
          return { error: 'card declined' }
        },
        answeredWith(402, { failedWrites: 'commit' }),
      )
      expect(result).toMatchObject({ kind: 'executed', outcome: 'failed' })
      expect(await orderRows(key)).toEqual(['audit'])
      expect(await setup.store.get('default', key)).toMatchObject({ status: 'failed', response: { status: 402 } })
    })

    it("a zombie past its lease cannot commit: the token refuses its completion and the tool's transaction rolls its write back", async () => {
      const key = `order-${randomUUID()}`
      const zombieWrote = gate()
      const zombieResumes = gate()
      const takerWrote = gate()
      const takerFinishes = gate()
      const zombie = new Ledger({ store: paused(setup.store), lease: 300 })
      const zombieRun = zombie.runInTransaction({ key, payload: 1 }, async ({ tx }) => {
        await setup.harness.insertOrder(tx, key, 'zombie')
        zombieWrote.open()
        await zombieResumes.opened
        return 'zombie'
      })
      await zombieWrote.opened
      await new Promise((resolve) => setTimeout(resolve, 450))
      const taker = new Ledger({ store: setup.store, wait: 0 })
      const takerRun = taker.runInTransaction({ key, payload: 1 }, async ({ tx, token, takeover }) => {
        await setup.harness.insertOrder(tx, key, 'taker')
        takerWrote.open()
        await takerFinishes.opened
        return { token, takeover }
      })
      // On MySQL the zombie's insert holds no lock the taker's insert waits for (no unique key), so both write.
      await takerWrote.opened
      expect(await setup.store.get('default', key)).toMatchObject({ status: 'in_progress', token: 2 })
      zombieResumes.open()
      expect(await zombieRun).toMatchObject({ kind: 'executed', outcome: 'fenced_out', token: 1 })
      takerFinishes.open()
      expect(await takerRun).toMatchObject({ kind: 'executed', outcome: 'completed', value: { token: 2, takeover: true } })
      expect(await orderRows(key)).toEqual(['taker'])
      expect(await setup.store.get('default', key)).toMatchObject({ status: 'completed', token: 2 })
    })

    /**
     * Two transfers between the same two accounts in opposite orders, each locking its first account
     * before either takes its second: InnoDB or PostgreSQL ends one of them with a deadlock. `onDeadlock`,
     * given, is what the loser's work does with the error instead of letting it out.
     */
    async function deadlockedTransfers(onDeadlock?: (error: unknown, tx: unknown, key: string) => Promise<void>) {
      const ledger = new Ledger({ store: setup.store })
      const [a, b] = [`acct-a-${randomUUID()}`, `acct-b-${randomUUID()}`]
      await setup.rows(`INSERT INTO ${q(tables.accounts)} (id, balance) VALUES ($1, 100), ($2, 100)`, [a, b])
      let arrived = 0
      const bothLocked = gate()
      const transfer = (key: string, first: string, second: string) =>
        ledger.runInTransaction({ key, payload: [first, second] }, async ({ tx }) => {
          await setup.harness.debit(tx, first)
          if (++arrived === 2) bothLocked.open()
          await bothLocked.opened
          if (!onDeadlock) await setup.harness.debit(tx, second)
          else await setup.harness.debit(tx, second).catch((error: unknown) => onDeadlock(error, tx, key))
          return 'moved'
        })
      const keys = [`transfer-${randomUUID()}`, `transfer-${randomUUID()}`]
      const results = await Promise.allSettled([transfer(keys[0] as string, a, b), transfer(keys[1] as string, b, a)])
      const failed = results.flatMap((r, i) => (r.status === 'rejected' ? [{ key: keys[i] as string, error: r.reason as unknown, i }] : []))
      expect(failed).toHaveLength(1)
      const { key, error, i } = failed[0] as { key: string; error: unknown; i: number }
      /** The loser's retry: it runs (token 2), and each account is debited once by each transfer. */
      const retryRunsOnce = async () => {
        const retry = await ledger.runInTransaction({ key, payload: i === 0 ? [a, b] : [b, a] }, async ({ tx, token }) => {
          await setup.harness.debit(tx, i === 0 ? a : b)
          await setup.harness.debit(tx, i === 0 ? b : a)
          return token
        })
        expect(retry).toMatchObject({ kind: 'executed', outcome: 'completed', value: 2 })
        const balances = await setup.rows(`SELECT balance FROM ${q(tables.accounts)} WHERE id IN ($1, $2) ORDER BY id`, [a, b])
        expect(balances.map((r) => Number(r.balance))).toEqual([98, 98])
      }
      return { key, error, retryRunsOnce }
    }

    it("the tool's deadlock error is surfaced as on the raw path: transient, rolled back, the record released, and the retry runs once", async () => {
      const { key, error, retryRunsOnce } = await deadlockedTransfers()
      expect(isTransient(error)).toBe(true)
      expect((await setup.store.get('default', key))?.status).toBe('in_progress')
      await retryRunsOnce()
    }, 30_000)

    // InnoDB rolls the whole transaction back on a deadlock and the connection goes on in autocommit; work
    // that catches the error and carries on writes outside any transaction. Its record must not be
    // completed (which, in autocommit, would commit at once): that would keep the writes after the
    // deadlock, lose those before it, and turn the retry into a replay. PostgreSQL refuses every statement
    // of an aborted transaction, so only MySQL/MariaDB can get here; the store sees it on MariaDB.
    it.skipIf(dialect !== 'mysql')(
      'work that catches its deadlock and carries on: the record is not completed, it is released, and the retry runs again',
      async () => {
        const caught: unknown[] = []
        const { key, error, retryRunsOnce } = await deadlockedTransfers(async (deadlock, tx, key) => {
          // The mistake under test: the deadlock is swallowed, and the work goes on.
          caught.push(deadlock)
          await setup.harness.insertOrder(tx as never, key, 'after-deadlock').catch(() => {})
        })
        expect(caught).toHaveLength(1)
        expect(isTransient(caught[0])).toBe(true)
        // The store's refusal (MariaDB), or the tool's own, when the tool knows its transaction ended (Sequelize).
        expect(error).toMatchObject({ code: 'STORE_UNAVAILABLE' })
        const record = await setup.store.get('default', key)
        expect(record).toMatchObject({ status: 'in_progress', token: 1 })
        // Released: the retry takes the record at once, without waiting out the lease.
        expect(record?.lockedUntilMs).toBeLessThanOrEqual(Date.now() + 1_000)
        await retryRunsOnce()
      },
      30_000,
    )

    it.skipIf(!(dialect === 'postgres' && ['drizzle', 'typeorm', 'sequelize'].includes(tool)))(
      "prepares the store's statements on the pg client under the tool's transaction: the same connection, inside the transaction",
      async () => {
        const { transactions } = setup.harness
        await transactions
          .transaction(async (tx) => {
            const client = transactions.pgClient?.(tx)
            expect(client).toBeDefined()
            const mine = (await client?.query({ text: 'SELECT pg_backend_pid() AS pid, txid_current_if_assigned() IS NOT NULL AS open' }))
              ?.rows[0]
            await setup.harness.insertOrder(tx, `probe-${suffix}`, 'probe')
            const after = (await client?.query({ text: 'SELECT pg_backend_pid() AS pid, txid_current_if_assigned() AS xid' }))?.rows[0] as
              | { pid: number; xid: string | null }
              | undefined
            expect(after?.pid).toBe((mine as { pid: number }).pid)
            // The tool's insert assigned this transaction an ID, seen from the client: one transaction.
            expect(after?.xid).not.toBeNull()
            throw new Error('roll the probe back')
          })
          .catch((error: unknown) => {
            if (!(error instanceof Error && error.message === 'roll the probe back')) throw error
          })
        expect(await orderRows(`probe-${suffix}`)).toEqual([])
      },
    )

    it.skipIf(!(dialect === 'postgres' && (tool === 'knex' || tool === 'kysely' || tool === 'mikro-orm')))(
      `sends the store's statements through ${tool} as named prepared statements on the transaction's connection`,
      async () => {
        const { transactions } = setup.harness
        await transactions.transaction(async (tx) => {
          expect((await transactions.execute(tx, 'SELECT $1::int AS one', [1])).count).toBe(1)
          // The count comes back through the tool on the same connection, so it sees that connection's statements.
          const probe = `SELECT 1 FROM pg_prepared_statements WHERE name LIKE 'idemkey_${tool}_%' AND statement = $1`
          expect((await transactions.execute(tx, probe, ['SELECT $1::int AS one'])).count).toBe(1)
        })
      },
    )

    it("outbox.add and inbox.record take the tool's transaction: they commit with the business write, and roll back with it", async () => {
      const { transactions } = setup.harness
      const names = { outbox: `${table}_outbox`, inbox: `${table}_inbox` }
      const pgPool = dialect === 'postgres' ? new pg.Pool({ connectionString: PG_URL, max: 2 }) : undefined
      const myPool = dialect === 'mysql' ? mysql.createPool({ uri: MYSQL_URL, connectionLimit: 2 }) : undefined
      const outbox = pgPool
        ? new PgOutbox({ pool: pgPool, table: names.outbox, transactions })
        : new MySqlOutbox({ pool: myPool as mysql.Pool, table: names.outbox, transactions })
      const inbox = pgPool
        ? new PgInbox({ pool: pgPool, consumer: 'billing', table: names.inbox, transactions })
        : new MySqlInbox({ pool: myPool as mysql.Pool, consumer: 'billing', table: names.inbox, transactions })
      try {
        await outbox.migrate()
        await inbox.migrate()
        const ledger = new Ledger({ store: setup.store })
        const [kept, dropped] = [`order-${randomUUID()}`, `order-${randomUUID()}`]
        const work = (key: string, fail: boolean) =>
          ledger.runInTransaction({ key, payload: 1 }, async ({ tx }) => {
            expect(await inbox.record(tx, { id: `msg-${key}`, payload: 'p' })).toBe('new')
            await setup.harness.insertOrder(tx, key, 'with-event')
            const added = await outbox.add(tx, { topic: 'orders.created', payload: { key }, idempotencyKey: key })
            if (fail) throw new Error('rolled back on purpose')
            return added
          })
        expect(await work(kept, false)).toMatchObject({ kind: 'executed', value: { created: true } })
        await expect(work(dropped, true)).rejects.toThrow('on purpose')
        expect(await orderRows(kept)).toEqual(['with-event'])
        expect(await orderRows(dropped)).toEqual([])
        expect(await outbox.stats()).toMatchObject({ pending: 1 })
        // The kept message is known (a redelivery is a duplicate, another payload a mismatch); the dropped one is not.
        await transactions.transaction(async (tx) => {
          expect(await inbox.record(tx, { id: `msg-${kept}`, payload: 'p' })).toBe('duplicate')
        })
        await expect(transactions.transaction((tx) => inbox.record(tx, { id: `msg-${kept}`, payload: 'other' }))).rejects.toBeInstanceOf(
          InboxMismatchError,
        )
        const unknown = transactions.transaction(async (tx) => {
          expect(await inbox.record(tx, { id: `msg-${dropped}`, payload: 'p' })).toBe('new')
          throw new Error('leave nothing behind')
        })
        await expect(unknown).rejects.toThrow('leave nothing behind')
      } finally {
        if (pgPool) {
          await setup.rows(`DROP TABLE IF EXISTS "${names.outbox}", "${names.inbox}"`, [])
          await pgPool.end()
        } else {
          const all = [names.outbox, `${names.outbox}_meta`, names.inbox, `${names.inbox}_meta`]
          await setup.rows(`DROP TABLE IF EXISTS ${all.map((name) => `\`${name}\``).join(', ')}`, [])
          await myPool?.end()
        }
      }
    })

    it('a process SIGKILLed after its business write and before commit leaves neither the row nor a completed record; the takeover runs once', async () => {
      const key = `order-${randomUUID()}`
      const child: ChildProcess = spawn(
        process.execPath,
        ['--import', 'tsx', WORKER, tool, dialect, table, tables.orders, tables.accounts, key],
        { stdio: ['ignore', 'pipe', 'inherit'] },
      )
      const exited = new Promise<NodeJS.Signals | null>((resolve) => child.once('exit', (_code, signal) => resolve(signal)))
      await new Promise<void>((resolve, reject) => {
        let seen = ''
        child.stdout?.on('data', (chunk: Buffer) => {
          seen += chunk.toString()
          if (seen.includes('wrote\n')) resolve()
        })
        child.once('exit', (code) => reject(new Error(`the worker exited (${code}) before its business write`)))
      })
      child.kill('SIGKILL')
      expect(await exited).toBe('SIGKILL')
      expect(await orderRows(key)).toEqual([])
      expect(await setup.store.get('default', key)).toMatchObject({ status: 'in_progress', token: 1 })
      const ledger = new Ledger({ store: setup.store, wait: 10_000 })
      let runs = 0
      const takeover = await ledger.runInTransaction({ key, payload: { total: 42 } }, async ({ tx, takeover }) => {
        runs++
        await setup.harness.insertOrder(tx, key, 'taker')
        return { takeover }
      })
      expect(takeover).toMatchObject({ kind: 'executed', outcome: 'completed', token: 2, value: { takeover: true } })
      expect(runs).toBe(1)
      expect(await orderRows(key)).toEqual(['taker'])
    }, 60_000)
  })
}
