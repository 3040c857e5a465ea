/**
 * MySqlInbox benchmark (issue 55): `handle` throughput on MySQL/MariaDB, the effect being one small
 * INSERT in the handler's transaction, for new message IDs (1 and 8 concurrent callers) and for
 * duplicates (the same IDs again, 8 callers), beside "raw mysql2": the same effect in a transaction of
 * its own with no inbox, measured in the same run on the same pool (so a busy neighbour shows in both).
 * Then 20 concurrent copies of one ID, several times: how many applied, duplicate and failed, and how
 * long a round took (before issue 55, copies past the second failed with a deadlock).
 * Needs MySQL or MariaDB on 127.0.0.1:3306 (user root, database test), or MYSQL_URI.
 * Run alone, in about 15 s: npx tsx bench/mysql-inbox.bench.ts [--ms 2000] [--copies 20] [--rounds 10]
 */
import { randomBytes } from 'node:crypto'
import mysql from 'mysql2/promise'
import { MySqlInbox } from '../src/messaging/inbox/index.js'
import { fmt, numberArg, opsPerSecond, percentile, report, table } from './lib.js'

const MS = numberArg('--ms', 2_000)
const COPIES = numberArg('--copies', 20)
const ROUNDS = numberArg('--rounds', 10)
const URI = process.env.MYSQL_URI ?? 'mysql://root@127.0.0.1:3306/test'
/** Every table this run creates starts with it (dropped at the end). */
const PREFIX = `idemkey_bench_inbox_${process.pid}_${randomBytes(3).toString('hex')}`
const EFFECTS = `${PREFIX}_fx`
const SLICES = 3
const CONNECTIONS = Math.max(24, COPIES + 4)
const payload = '{"account":"acct_1","amount":100}'

const pool = mysql.createPool({ uri: URI, connectionLimit: CONNECTIONS })
const inbox = new MySqlInbox({ pool, consumer: 'bench', table: PREFIX })

/** The effect: one INSERT in the handler's transaction. */
const effect = async (tx: mysql.PoolConnection, id: string) => {
  await tx.execute(`INSERT INTO ${EFFECTS} (message_id, amount) VALUES (?, 100)`, [id])
}

async function handleNew(id: string): Promise<void> {
  const result = await inbox.handle({ id, payload }, (tx) => effect(tx as mysql.PoolConnection, id))
  if (result.status !== 'applied') throw new Error(`expected applied for ${id}, got ${result.status}`)
}

/** The same effect in a transaction of its own, no inbox: the floor. */
async function rawEffect(id: string): Promise<void> {
  const connection = await pool.getConnection()
  try {
    await connection.query('START TRANSACTION')
    await effect(connection, id)
    await connection.query('COMMIT')
  } finally {
    connection.release()
  }
}

/** Runs `copies` concurrent `handle`s of one new ID; counts each outcome and the errors' messages. */
async function copiesRound(id: string) {
  const started = performance.now()
  const settled = await Promise.allSettled(
    Array.from({ length: COPIES }, () => inbox.handle({ id, payload }, (tx) => effect(tx as mysql.PoolConnection, id))),
  )
  const ms = performance.now() - started
  const count = { applied: 0, duplicate: 0, errors: 0 }
  const messages: string[] = []
  for (const s of settled) {
    if (s.status === 'rejected') {
      count.errors++
      messages.push(String((s.reason as Error)?.message ?? s.reason).slice(0, 160))
    } else if (s.value.status === 'applied') count.applied++
    else count.duplicate++
  }
  return { ...count, ms, messages }
}

try {
  await inbox.migrate()
  await pool.query(`CREATE TABLE ${EFFECTS} (message_id VARCHAR(255) NOT NULL PRIMARY KEY, amount INT NOT NULL) ENGINE = InnoDB`)
  const [version] = await pool.query('SELECT VERSION() AS v, @@innodb_flush_log_at_trx_commit AS flush')
  const server = (version as Array<{ v: string; flush: number }>)[0]
  // Warm the buffer pool, the statement caches and the JIT.
  await opsPerSecond((i) => handleNew(`w-${i}`), 600, 8)

  const rows: Array<Array<string | number>> = []
  const applied: string[] = []
  for (const callers of [1, 8]) {
    // Three slices of each, alternating (which goes first alternates too), so a busy neighbour hurts both alike.
    let [rawRate, rate] = [0, 0]
    for (let slice = 0; slice < SLICES; slice++) {
      const raw = () => opsPerSecond((i) => rawEffect(`r${callers}-${slice}-${i}`), MS / SLICES, callers)
      const handled = () =>
        opsPerSecond(
          async (i) => {
            const id = `n${callers}-${slice}-${i}`
            await handleNew(id)
            if (callers === 8) applied.push(id)
          },
          MS / SLICES,
          callers,
        )
      if (slice % 2 === 0) {
        rawRate += (await raw()) / SLICES
        rate += (await handled()) / SLICES
      } else {
        rate += (await handled()) / SLICES
        rawRate += (await raw()) / SLICES
      }
    }
    rows.push(['raw mysql2: the effect in its own transaction', 'new', callers, fmt(rawRate), '100%'])
    rows.push(['MySqlInbox.handle', 'new IDs (applied)', callers, fmt(rate), `${fmt((100 * rate) / rawRate)}%`])
  }
  const duplicates = await opsPerSecond(
    async (i) => {
      const id = applied[i % applied.length] as string
      const result = await inbox.handle({ id, payload }, (tx) => effect(tx as mysql.PoolConnection, id))
      if (result.status !== 'duplicate') throw new Error(`expected duplicate for ${id}, got ${result.status}`)
    },
    MS,
    8,
  )
  rows.push(['MySqlInbox.handle', 'the same IDs again (duplicate)', 8, fmt(duplicates), '-'])

  const rounds: Array<Awaited<ReturnType<typeof copiesRound>>> = []
  for (let r = 0; r < ROUNDS; r++) rounds.push(await copiesRound(`copies-${r}`))
  const [effects] = await pool.query(`SELECT COUNT(*) AS n FROM ${EFFECTS} WHERE message_id LIKE 'copies-%'`)
  const effectRows = Number((effects as Array<{ n: number }>)[0]?.n)
  const sum = (k: 'applied' | 'duplicate' | 'errors') => rounds.reduce((total, round) => total + round[k], 0)
  const errorKinds = [...new Set(rounds.flatMap((round) => round.messages.map((m) => m.replace(/copies-\d+/, 'copies-N'))))]
  const times = rounds.map((round) => round.ms)

  report(
    'mysql-inbox',
    'MySqlInbox (MySQL/MariaDB over loopback): handle, duplicates and concurrent copies',
    `npx tsx bench/mysql-inbox.bench.ts --ms ${MS} --copies ${COPIES} --rounds ${ROUNDS}`,
    `Server: ${server?.v}, innodb_flush_log_at_trx_commit=${server?.flush}, on the same machine; pool of ${CONNECTIONS} connections.

${table(['path', 'messages', 'callers', 'messages/s', 'of raw, same callers'], rows)}

${COPIES} concurrent \`handle\`s of one new ID, ${ROUNDS} rounds (a new ID each):

${table(
  ['copies', 'rounds', 'applied', 'duplicate', 'errors', 'effect rows', 'ms per round, median', 'ms per round, max'],
  [
    [
      COPIES,
      ROUNDS,
      sum('applied'),
      sum('duplicate'),
      sum('errors'),
      effectRows,
      fmt(percentile(times, 50), 1),
      fmt(Math.max(...times), 1),
    ],
  ],
)}
${errorKinds.length > 0 ? `\nErrors seen: ${errorKinds.map((m) => `"${m}"`).join('; ')}\n` : ''}
The effect is one INSERT of the message's ID into a table of its own, in the transaction \`handle\` opens (\`START TRANSACTION\`, the inbox's INSERT … ON DUPLICATE KEY UPDATE, the effect, \`COMMIT\`); a duplicate rolls back after the inbox's statements and runs no effect. "raw mysql2" is the effect alone in a transaction of its own on a pooled connection, measured with the same callers in ${SLICES} slices alternating with the inbox's (${fmt(MS / 1_000, 1)} s of each in all): the gap is the inbox's cost (one more statement in each transaction). ${fmt(MS / 1_000, 1)} s per row after a warm-up. The server shares the 2-core machine with the benchmark and with other sessions' work: compare rows of one run, not runs.`,
  )
} finally {
  const [tables] = await pool.query(
    'SELECT table_name AS t FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name LIKE ?',
    [`${PREFIX}%`],
  )
  for (const { t } of tables as Array<{ t: string }>) await pool.query(`DROP TABLE IF EXISTS \`${t}\``)
  await pool.end()
}
