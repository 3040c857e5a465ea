/**
 * What a store's server can lose, per failure: the neutral report `idemkey doctor`, the operator page and
 * the admin servers' `/readyz` share. Each backend reads its own server's settings into one
 * (`backends/<db>/durability-report.ts`); {@link assessDurability} decides whether it passes.
 */

/** The failures a report answers for, one row each. */
export const FAILURES = ['process-crash', 'machine-crash', 'failover', 'eviction', 'expiry'] as const

/** One failure: the database process killed; the machine losing power; a replica promoted; memory pressure; a record's TTL. */
export type Failure = (typeof FAILURES)[number]

/**
 * What the settings say about one failure:
 * - `safe`: no acknowledged record is lost by it;
 * - `loses`: an acknowledged record can be lost (or come back as new) by this one failure;
 * - `unchecked`: a setting it depends on could not be read: not proven safe;
 * - `n/a`: it cannot happen to this setup (no replica to promote; a database that never evicts).
 */
export type Verdict = 'safe' | 'loses' | 'unchecked' | 'n/a'

/** One row of a report. */
export interface DurabilityFinding {
  failure: Failure
  verdict: Verdict
  /** What this setup loses to it, in words (or why it loses nothing, or what could not be read). */
  loses: string
  /** The exact setting that closes it (`appendfsync always`); empty when nothing is to be done. */
  fix: string
  /** The settings this row was decided from, as read (`appendonly=yes`). */
  evidence: string[]
}

/** What one server's configuration means for idemkey's records. */
export interface DurabilityReport {
  /** `redis`, `postgres`, `mysql`, `sqlite`, `dynamodb`. */
  store: string
  /** The server as it describes itself (`Redis 7.0.15 (standalone, master)`), when it said. */
  server?: string
  findings: DurabilityFinding[]
  /** Settings that could not be read, each with why (`CONFIG GET appendonly: NOPERM …`). */
  unchecked: string[]
  /** What matters beside the five failures (wal_level for CDC, backups), not counted in the exit status. */
  notes: string[]
}

/** What {@link assessDurability} decided. */
export interface DurabilityAssessment {
  /** `safe`: nothing unaccepted loses or is unproven; `unsafe`: a failure not accepted loses records; `unproven`: none proven to lose, some unchecked. */
  status: 'safe' | 'unsafe' | 'unproven'
  /** The failures not accepted that lose acknowledged records. */
  losing: Failure[]
  /** The failures not accepted whose settings could not be read. */
  unproven: Failure[]
  /** The failures the caller accepted. */
  accepted: Failure[]
}

/**
 * Whether a report passes, given the failures the caller accepts: `unsafe` when a single failure not
 * accepted can lose an acknowledged record; `unproven` when none is proven to but some could not be
 * checked (never a false safe).
 *
 * @example assessDurability(report, ['machine-crash']).status
 */
export function assessDurability(report: DurabilityReport, accept: readonly Failure[] = []): DurabilityAssessment {
  const accepted = new Set(accept)
  const open = report.findings.filter((f) => !accepted.has(f.failure))
  const losing = open.filter((f) => f.verdict === 'loses').map((f) => f.failure)
  const unproven = open.filter((f) => f.verdict === 'unchecked').map((f) => f.failure)
  const status = losing.length > 0 ? 'unsafe' : unproven.length > 0 ? 'unproven' : 'safe'
  return { status, losing, unproven, accepted: FAILURES.filter((f) => accepted.has(f)) }
}

/** Reads `--accept machine-crash,failover`; throws a message naming the failures for a word it does not know. */
export function parseFailures(text: string): Failure[] {
  const words = text
    .split(',')
    .map((w) => w.trim())
    .filter(Boolean)
  for (const word of words) {
    if (!(FAILURES as readonly string[]).includes(word)) {
      throw new Error(`unknown failure "${word}": expected a comma-separated list of ${FAILURES.join(', ')}`)
    }
  }
  return words as Failure[]
}

/** A report of a server that could not be read at all: every failure unchecked, with why. */
export function unreachableReport(store: string, reason: string): DurabilityReport {
  return {
    store,
    findings: FAILURES.map((failure) => ({
      failure,
      verdict: 'unchecked',
      loses: `not checked: ${reason}`,
      fix: '',
      evidence: [],
    })),
    unchecked: [`the server: ${reason}`],
    notes: [],
  }
}

/** One finding, for the readers' brevity. */
export function finding(failure: Failure, verdict: Verdict, loses: string, fix = '', evidence: string[] = []): DurabilityFinding {
  return { failure, verdict, loses, fix, evidence }
}

/** A setting read from a server: its value, or why it could not be read (counted as unchecked). */
export type Setting = { ok: true; value: string } | { ok: false; reason: string }

/** Reads one setting with `read`, turning a refusal into `{ ok: false }` and recording it in `unchecked`. */
export async function readSetting(name: string, read: () => Promise<string | undefined>, unchecked: string[]): Promise<Setting> {
  try {
    const value = await read()
    if (value === undefined) {
      unchecked.push(`${name}: the server did not report it`)
      return { ok: false, reason: `${name} not reported` }
    }
    return { ok: true, value }
  } catch (error) {
    const reason = `${name}: ${error instanceof Error ? error.message : String(error)}`
    unchecked.push(reason)
    return { ok: false, reason }
  }
}

/** What `/readyz` and the operator page show of a report: the verdict, what loses, what is unproven. */
export interface DurabilitySummary {
  status: DurabilityAssessment['status']
  losing: Failure[]
  unproven: Failure[]
  unchecked: string[]
  /** Set when the report itself could not be made. */
  error?: string
  report?: DurabilityReport
}

/**
 * A reader that asks the server at most once per `ttlMs` (a `/readyz` probe every few seconds must not
 * open a connection each time) and never throws: a failure is an `unproven` summary with the error.
 *
 * @example const durability = cachedDurability(() => redisDurabilityReport(call), 60_000)
 */
export function cachedDurability(
  read: () => Promise<DurabilityReport>,
  ttlMs = 60_000,
  accept: readonly Failure[] = [],
  now: () => number = Date.now,
): () => Promise<DurabilitySummary> {
  let cached: { atMs: number; value: Promise<DurabilitySummary> } | undefined
  return () => {
    if (cached && now() - cached.atMs < ttlMs) return cached.value
    const value = Promise.resolve()
      .then(read)
      .then(
        (report): DurabilitySummary => {
          const a = assessDurability(report, accept)
          return { status: a.status, losing: a.losing, unproven: a.unproven, unchecked: report.unchecked, report }
        },
        (error: unknown): DurabilitySummary => ({
          status: 'unproven',
          losing: [],
          unproven: [...FAILURES],
          unchecked: [],
          error: error instanceof Error ? error.message : String(error),
        }),
      )
    cached = { atMs: now(), value }
    return value
  }
}
