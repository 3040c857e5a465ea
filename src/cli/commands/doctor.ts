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
import { type Command, InvalidArgumentError } from '../program.js'
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
  out.push('', verdictLine(assessment))
  return out.join('\n')
}

function verdictLine(a: DurabilityAssessment): string {
  const acceptedText = a.accepted.length > 0 ? ` (accepted: ${a.accepted.join(', ')})` : ''
  if (a.status === 'unsafe') {
    return `UNSAFE: a single ${a.losing.join(', ')} can lose acknowledged records${acceptedText}. Apply the settings under "closed by", or accept it: --accept ${a.losing.join(',')}. Exit ${DOCTOR_EXIT.unsafe}.`
  }
  if (a.status === 'unproven') {
    return `NOT PROVEN: ${a.unproven.join(', ')} could not be checked (see above), and nothing checked loses records${acceptedText}. Exit ${DOCTOR_EXIT.unproven}.`
  }
  return `SAFE: no single failure${a.accepted.length > 0 ? ' not accepted' : ''} loses an acknowledged record${acceptedText}. Exit ${DOCTOR_EXIT.safe}.`
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
      (value: string) => {
        try {
          return parseFailures(value)
        } catch (error) {
          throw new InvalidArgumentError((error as Error).message)
        }
      },
    )
    .option('--wait-replicas <n>', "Redis: replicas the app's RedisStore waits for (its durability option, WAIT n)", positiveInt)
    .option(
      '--synchronous <level>',
      "SQLite: the app's connection's synchronous level (off, normal, full, extra)",
      (value: string) => {
        if (!['off', 'normal', 'full', 'extra'].includes(value)) throw new InvalidArgumentError('Allowed: off, normal, full, extra.')
        return value
      },
      undefined,
    )
    .option('--timeout <ms>', 'how long to wait for the server', positiveInt, 5_000)
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
    .action(async (url: string, options: DoctorOptions) => {
      const result = await runDoctor(url, options)
      process.stdout.write(options.json ? `${JSON.stringify(result.json, null, 2)}\n` : `${result.text}\n`)
      process.exitCode = result.exitCode
    })
}

function positiveInt(value: string): number {
  const n = Number(value)
  if (!Number.isInteger(n) || n < 0) throw new InvalidArgumentError('Expected a whole number.')
  return n
}
