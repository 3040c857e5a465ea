import {
  assessDurability,
  type DurabilityAssessment,
  type DurabilityReport,
  FAILURES,
  type Failure,
  parseFailures,
} from '../../core/durability.js'
import { redactUrl } from '../../core/redact-url.js'
import { isIdempotencyError } from '../../errors.js'
import { renderTable } from '../output.js'
import type { Command } from '../program.js'
import { CliError } from '../run.js'
import { parseStoreUrl } from '../store-url.js'
import { readDurability } from './doctor-read.js'

/** The exit statuses of `idemkey doctor` (docs/durability.md, "Exit status"). */
export const DOCTOR_EXIT = { safe: 0, unsafe: 1, usage: 2, unproven: 3 } as const

interface DoctorOptions {
  accept?: Failure[]
  json?: boolean
  waitReplicas?: number
  synchronous?: 'off' | 'normal' | 'full' | 'extra'
  timeout?: number
}

/** What `idemkey doctor` prints and its exit status, for the command and its tests. */
export interface DoctorResult {
  exitCode: number
  report: DurabilityReport
  assessment: DurabilityAssessment
  text: string
  json: Record<string, unknown>
}

/**
 * Reads the server a store URL names and decides: exit 0 when no single failure the caller did not
 * accept loses an acknowledged record, 1 when one does, 3 when none is proven to but some setting could
 * not be read (unreachable server, missing rights). Bad input (an unknown scheme) throws a CliError (2).
 */
export async function runDoctor(url: string, options: DoctorOptions = {}): Promise<DoctorResult> {
  let spec: ReturnType<typeof parseStoreUrl>
  try {
    spec = parseStoreUrl(url)
  } catch (error) {
    if (isIdempotencyError(error)) throw new CliError(`${error.message} Nothing was checked.`, DOCTOR_EXIT.usage)
    throw error
  }
  const report = await readDurability(spec, {
    ...(options.waitReplicas === undefined ? {} : { waitReplicas: options.waitReplicas }),
    ...(options.synchronous === undefined ? {} : { synchronous: options.synchronous }),
    ...(options.timeout === undefined ? {} : { timeoutMs: options.timeout }),
  })
  const assessment = assessDurability(report, options.accept ?? [])
  const exitCode = DOCTOR_EXIT[assessment.status]
  const where = redactUrl(url)
  const json = {
    url: where,
    ...report,
    status: assessment.status,
    exitCode,
    accepted: assessment.accepted,
    losing: assessment.losing,
    unproven: assessment.unproven,
  }
  return { exitCode, report, assessment, text: renderDoctor(where, report, assessment), json }
}

/** The report as one table, then what was not checked, the notes and the verdict. */
export function renderDoctor(where: string, report: DurabilityReport, assessment: DurabilityAssessment): string {
  const accepted = new Set(assessment.accepted)
  const rows = report.findings.map((f) => [
    f.failure,
    f.verdict === 'loses' ? (accepted.has(f.failure) ? 'LOSES (accepted)' : 'LOSES') : f.verdict === 'unchecked' ? 'UNCHECKED' : f.verdict,
    f.loses,
    f.fix || '-',
    f.evidence.join(' ') || '-',
  ])
  const out = [
    `${where}${report.server ? `: ${report.server}` : ''}`,
    '',
    renderTable(['failure', 'verdict', 'can lose', 'closed by', 'read'], rows),
  ]
  if (report.unchecked.length > 0) out.push('', 'Not checked (not proven safe):', ...report.unchecked.map((u) => `  - ${u}`))
  if (report.notes.length > 0) out.push('', 'Notes:', ...report.notes.map((n) => `  - ${n}`))
  out.push('', verdictLine(assessment, report))
  return out.join('\n')
}

function verdictLine(a: DurabilityAssessment, report: DurabilityReport): string {
  const acceptedText = a.accepted.length > 0 ? ` (accepted: ${a.accepted.join(', ')})` : ''
  if (a.status === 'unsafe') {
    return `UNSAFE: a single ${a.losing.join(', ')} can lose acknowledged records${acceptedText}. Apply the settings under "closed by", or accept it: --accept ${a.losing.join(',')}. Exit ${DOCTOR_EXIT.unsafe}.`
  }
  if (a.status === 'unproven') {
    return `NOT PROVEN: ${a.unproven.join(', ')} could not be checked (see above), and nothing checked loses records${acceptedText}. Exit ${DOCTOR_EXIT.unproven}.`
  }
  // A setting no row depends on (DynamoDB's point-in-time recovery) is still named: safe, not "all checked".
  const aside = report.unchecked.length > 0 ? ` Not checked, and no row depends on it: ${report.unchecked.join('; ')}.` : ''
  return `SAFE: no single failure${a.accepted.length > 0 ? ' not accepted' : ''} loses an acknowledged record${acceptedText}.${aside} Exit ${DOCTOR_EXIT.safe}.`
}

/** `idemkey doctor <store-url>`. */
export function registerDoctor(program: Command): void {
  program
    .command('doctor')
    .description(
      "read a store's server settings and say, per failure (process crash, machine crash, failover, eviction, expiry), what it can lose and the setting that closes it",
    )
    .argument('<store-url>', 'the store to check: redis://…, postgres://…, mysql://…, sqlite:PATH, dynamodb://TABLE')
    .option(
      '--accept <failures>',
      `failures whose loss you accept, comma-separated (${FAILURES.join(', ')}): they do not fail the exit status`,
    )
    .option('--wait-replicas <n>', "Redis: replicas the app's RedisStore waits for (its durability option, WAIT n)")
    .option(
      '--synchronous <level>',
      "SQLite: the synchronous level of the app's connection (off, normal, full, extra; SqliteStore's default: normal)",
    )
    .option('--timeout <ms>', 'how long to wait for the server', '5000')
    .option('--json', 'print the report as JSON')
    .addHelpText(
      'after',
      `
Exit status: 0 safe, 1 a single failure not accepted can lose an acknowledged record, 2 bad input,
3 not proven (a setting could not be read, or the server did not answer).

Examples:
  idemkey doctor redis://127.0.0.1:6379
  idemkey doctor postgres://app@db:5432/app --accept failover
  idemkey doctor sqlite:data/idemkey.db --synchronous full --json`,
    )
    .action(async (url: string, flags: Record<string, string | boolean | undefined>) => {
      const options = doctorOptions(flags)
      const result = await runDoctor(url, options)
      process.stdout.write(options.json ? `${JSON.stringify(result.json, null, 2)}\n` : `${result.text}\n`)
      process.exitCode = result.exitCode
    })
}

/** The flags' values, read here so a wrong one exits 2 (bad input), not 1 (which means unsafe). */
function doctorOptions(flags: Record<string, string | boolean | undefined>): DoctorOptions {
  const bad = (message: string) => new CliError(message, DOCTOR_EXIT.usage, true)
  const whole = (name: string, value: string) => {
    const n = Number(value)
    if (value.trim() === '' || !Number.isInteger(n) || n < 0)
      throw bad(`option '--${name}' argument '${value}' is invalid. Expected a whole number.`)
    return n
  }
  const options: DoctorOptions = { json: flags.json === true, timeout: whole('timeout', String(flags.timeout)) }
  if (typeof flags.accept === 'string') {
    try {
      options.accept = parseFailures(flags.accept)
    } catch (error) {
      throw bad(`option '--accept <failures>' argument '${flags.accept}' is invalid. ${(error as Error).message}. Nothing was checked.`)
    }
  }
  if (typeof flags.waitReplicas === 'string') options.waitReplicas = whole('wait-replicas', flags.waitReplicas)
  if (typeof flags.synchronous === 'string') {
    const level = flags.synchronous.toLowerCase()
    if (!['off', 'normal', 'full', 'extra'].includes(level)) {
      throw bad(`option '--synchronous <level>' argument '${flags.synchronous}' is invalid. Allowed: off, normal, full, extra.`)
    }
    options.synchronous = level as NonNullable<DoctorOptions['synchronous']>
  }
  return options
}
