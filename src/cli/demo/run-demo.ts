import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { openNodeSqlite } from '../../backends/sqlite/driver.js'
import { redactUrl } from '../../core/redact-url.js'
import { IdempotencyError } from '../../errors.js'
import { openStore, parseStoreUrl } from '../store-url.js'
import { drive, type IntentResult } from './driver.js'
import { type Fault, FaultInjector } from './fault-injector.js'
import { createChargesTable, type WorkerConfig } from './payments-api.js'
import { type FaultRates, planIntents } from './plan.js'
import { WorkerPool } from './workers.js'

/** Options of {@link runDemo}. */
export interface DemoOptions {
  intents: number
  rates: FaultRates
  /** Worker processes per API. */
  workers: number
  /** Ledger store of the protected API. @default a SQLite file in a temporary directory */
  store?: string
  concurrency: number
  seed: number
  leaseMs: number
  /** The clients' per-attempt timeout; the `timeout` fault makes the bank slower than this. */
  attemptTimeoutMs: number
  /** Called after each intent: which API, how many of its intents are done, out of how many. */
  onProgress?: (api: ApiName, done: number, total: number) => void
}

/** The two runs of the payments API. */
export type ApiName = 'bare' | 'protected'

/** What one run of the payments API did, counted from the charges table and the clients. */
export interface SideReport {
  api: ApiName
  intents: number
  httpAttempts: number
  chargesMade: number
  /** Charges beyond the first for an intent. */
  doubleCharges: number
  /** Intents with no charge at all. */
  lostIntents: number
  /**
   * Bank calls refused as repeats of a bank key: a request taken over after its worker was killed
   * between the bank's charge and the recorded outcome (always 0 for the bare API, which has no keys).
   */
  bankRepeatsRefused: number
  /**
   * Reservations and receipt emails the stock service and the mailer refused as repeats of a step's key:
   * a request taken over after its worker was killed between the step's effect and its recorded result
   * (always 0 for the bare API).
   */
  stepRepeatsRefused: number
  /** Checkout steps beyond the first for an intent: reservations and receipt emails made again. */
  doubleReservations: number
  doubleEmails: number
  /**
   * Steps a takeover did not run again because an attempt killed after them had recorded their result
   * (`ctx.step`, docs/steps.md; always 0 for the bare API, which reruns every step).
   */
  stepsResumed: number
  reuseAttempts: number
  keyReusesRejected: number
  /** Intents whose client gave up (retries or time ran out). */
  clientGaveUp: number
  workerRestarts: number
  p50Ms: number
  p99Ms: number
  seconds: number
}

/** The whole demo's result. */
export interface DemoReport {
  store: string
  intents: number
  workers: number
  seed: number
  /** Lease of the protected API's records: how long a killed worker's intent waits for a takeover. */
  leaseMs: number
  faults: Record<Fault, number>
  /**
   * What the seed does not make repeatable. The seed fixes the traffic (intents, amounts), the fault of
   * each intent and the clients' retry jitter; timing it cannot fix.
   */
  repeatability: {
    /** Fields of the side reports that may differ between two runs with the same seed and flags. */
    variable: Array<keyof SideReport>
    /** The same, in a sentence. */
    varies: string
  }
  bare: SideReport
  protected: SideReport
  /** The protected API made no double charge (nor reservation, nor email), lost no intent and rejected every reused key. */
  passed: boolean
}

/**
 * Runs the payments API bare, then behind idemkey, with the same seeded traffic and faults, and
 * counts what happened from the data. Everything lives in a temporary directory, removed at the end.
 */
export async function runDemo(options: DemoOptions): Promise<DemoReport> {
  if (options.store && parseStoreUrl(options.store).kind === 'memory') {
    throw new IdempotencyError(
      'INVALID_OPTION',
      'The demo runs its API in several processes, which cannot share a memory: store. Use sqlite:PATH, postgres://… or redis://….',
    )
  }
  const dir = mkdtempSync(join(tmpdir(), 'idemkey-demo-'))
  try {
    const chargesPath = join(dir, 'charges.db')
    createChargesTable(chargesPath)
    const storeUrl = options.store ?? `sqlite:${join(dir, 'ledger.db')}`
    const opened = await openStore(storeUrl)
    try {
      await opened.migrate()
    } finally {
      await opened.store.close()
    }
    const plan = planIntents(options.intents, options.rates, options.seed)
    const faults = new Map(plan.map((intent) => [intent.id, intent.fault]))
    const config = (mode: ApiName): WorkerConfig => ({
      mode,
      chargesPath,
      storeUrl,
      scope: `demo-${Date.now()}-${process.pid}`,
      leaseMs: options.leaseMs,
      waitMs: Math.floor(options.attemptTimeoutMs * 0.8),
      slowMs: Math.floor(options.attemptTimeoutMs * 1.5),
    })
    const entry = new URL('./payments-api.js', import.meta.url)
    const sides: SideReport[] = []
    for (const api of ['bare', 'protected'] as const) {
      const pool = new WorkerPool(entry, config(api), options.workers)
      let injector: FaultInjector | undefined
      try {
        await pool.ready()
        injector = new FaultInjector(pool, faults)
        const origin = await injector.listen()
        let done = 0
        const started = performance.now()
        const results = await drive(origin, plan, {
          seed: options.seed,
          concurrency: options.concurrency,
          attemptTimeoutMs: options.attemptTimeoutMs,
          onIntentDone: () => options.onProgress?.(api, ++done, plan.length),
        })
        const seconds = (performance.now() - started) / 1000
        sides.push(count(api, chargesPath, results, injector.attempts, pool.restarts, seconds))
      } finally {
        await injector?.close()
        await pool.stop()
      }
    }
    const [bare, guarded] = sides as [SideReport, SideReport]
    const tally = Object.fromEntries(['none', 'drop', 'timeout', 'crash', 'double', 'reuse'].map((f) => [f, 0])) as Record<Fault, number>
    for (const intent of plan) tally[intent.fault]++
    return {
      store: storeUrl.startsWith('sqlite:') && !options.store ? 'sqlite (temporary file)' : redactUrl(storeUrl),
      intents: options.intents,
      workers: options.workers,
      seed: options.seed,
      leaseMs: options.leaseMs,
      faults: tally,
      repeatability: repeatability(tally.crash > 0),
      bare,
      protected: guarded,
      passed:
        guarded.doubleCharges === 0 &&
        guarded.doubleReservations === 0 &&
        guarded.doubleEmails === 0 &&
        guarded.lostIntents === 0 &&
        guarded.keyReusesRejected === guarded.reuseAttempts,
    }
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
}

function count(
  api: ApiName,
  chargesPath: string,
  results: IntentResult[],
  attempts: number,
  restarts: number,
  seconds: number,
): SideReport {
  const db = openNodeSqlite(chargesPath, { readOnly: true })
  let perIntent: Map<string, number>
  let bankRepeatsRefused = 0
  let stepRepeatsRefused = 0
  let stepsResumed = 0
  const repeats = (table: string) =>
    (
      db
        .prepare(`SELECT COALESCE(SUM(n - 1), 0) AS n FROM (SELECT COUNT(*) AS n FROM ${table} WHERE api = ? GROUP BY intent)`)
        .get(api) as { n: number }
    ).n
  let doubleReservations: number
  let doubleEmails: number
  try {
    if (api === 'protected') {
      bankRepeatsRefused = (db.prepare('SELECT COUNT(*) AS n FROM bank_repeats').get() as { n: number }).n
      stepRepeatsRefused = (db.prepare('SELECT COUNT(*) AS n FROM step_repeats').get() as { n: number }).n
      stepsResumed = (db.prepare('SELECT COUNT(*) AS n FROM step_resumes').get() as { n: number }).n
    }
    doubleReservations = repeats('reservations')
    doubleEmails = repeats('emails')
    const rows = db.prepare('SELECT intent, COUNT(*) AS n FROM charges WHERE api = ? GROUP BY intent').all(api) as Array<{
      intent: string
      n: number
    }>
    perIntent = new Map(rows.map((row) => [row.intent, row.n]))
  } finally {
    db.close()
  }
  let chargesMade = 0
  let doubleCharges = 0
  for (const n of perIntent.values()) {
    chargesMade += n
    doubleCharges += Math.max(0, n - 1)
  }
  const latencies = results.map((r) => r.latencyMs).sort((a, b) => a - b)
  const reuse = results.filter((r) => r.reuseRejected !== undefined)
  return {
    api,
    intents: results.length,
    httpAttempts: attempts,
    chargesMade,
    doubleCharges,
    lostIntents: results.filter((r) => !perIntent.has(r.id)).length,
    bankRepeatsRefused,
    stepRepeatsRefused,
    doubleReservations,
    doubleEmails,
    stepsResumed,
    reuseAttempts: reuse.length,
    keyReusesRejected: reuse.filter((r) => r.reuseRejected).length,
    clientGaveUp: results.filter((r) => !r.ok).length,
    workerRestarts: restarts,
    p50Ms: percentile(latencies, 0.5),
    p99Ms: percentile(latencies, 0.99),
    seconds,
  }
}

function repeatability(crashes: boolean): DemoReport['repeatability'] {
  if (!crashes) {
    return {
      variable: ['p50Ms', 'p99Ms', 'seconds'],
      varies:
        'Timing it cannot fix: latencies and run time vary between runs. The counts repeat, unless the machine is so loaded that a request outlasts --client-timeout and turns into one more retry.',
    }
  }
  return {
    variable: [
      'p50Ms',
      'p99Ms',
      'seconds',
      'httpAttempts',
      'chargesMade',
      'doubleCharges',
      'doubleReservations',
      'doubleEmails',
      'bankRepeatsRefused',
      'stepRepeatsRefused',
      'stepsResumed',
      'workerRestarts',
    ],
    varies:
      "Timing it cannot fix: latencies and run time vary, and so do HTTP attempts, the bare API's charges, restarts and repeats refused by key, because which other requests a killed worker takes down with it depends on timing. With --crash-rate 0 the counts repeat.",
  }
}

/** Nearest-rank percentile of sorted values. */
function percentile(sorted: number[], p: number): number {
  if (sorted.length === 0) return 0
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(p * sorted.length) - 1))] as number
}
