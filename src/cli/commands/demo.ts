import { formatDuration } from '../../core/duration.js'
import type { ApiName, DemoReport } from '../demo/run-demo.js'
import { durationOption, intArg, rateArg, storeArg, TIMEOUT_OF_ZERO } from '../options.js'
import { printJson, renderTable } from '../output.js'
import type { Command } from '../program.js'
import { progressLine } from '../progress-line.js'
import { CliError } from '../run.js'

interface DemoFlags {
  intents: number
  workers: number
  concurrency: number
  store?: string
  dropRate: number
  timeoutRate: number
  crashRate: number
  doubleRate: number
  reuseRate: number
  lease: number
  clientTimeout: number
  seed: number
  json?: boolean
}

/** `idemkey demo`: a payments API run bare and behind idemkey under the same faulty traffic. */
export function registerDemo(program: Command): void {
  program
    .command('demo')
    .description('run a payments API bare and behind idemkey under the same faults; compare double charges')
    .option('--intents <n>', 'payments the clients mean to make, once each', intArg('--intents', 1, 100_000), 300)
    .option('--workers <n>', 'worker processes per API', intArg('--workers', 1, 32), 2)
    .option('--concurrency <n>', 'intents in flight at once', intArg('--concurrency', 1, 1000), 8)
    .option('--store <url>', 'ledger store of the protected API (default: a temporary SQLite file)', storeArg)
    .option('--drop-rate <rate>', 'responses lost after the server committed', rateArg('--drop-rate'), 0.08)
    .option('--timeout-rate <rate>', 'slow requests that make the client time out and retry', rateArg('--timeout-rate'), 0.04)
    .option('--crash-rate <rate>', 'workers SIGKILLed mid-request (then restarted)', rateArg('--crash-rate'), 0.02)
    .option('--double-rate <rate>', 'double clicks: the same intent sent twice at once', rateArg('--double-rate'), 0.05)
    .option('--reuse-rate <rate>', 'clients that reuse a key with another amount', rateArg('--reuse-rate'), 0.03)
    .addOption(
      durationOption('--lease <duration>', "lease of the protected API's records (a crashed worker's intent is taken over after it)", '2s'),
    )
    .addOption(durationOption('--client-timeout <duration>', 'per-attempt timeout of the clients', '1s', TIMEOUT_OF_ZERO, true))
    .option('--seed <n>', "seed of the traffic, the faults and the clients' retry jitter", intArg('--seed', 0, 2 ** 31), 42)
    .option('--json', 'print the report as JSON instead of a table')
    .addHelpText(
      'after',
      `
Examples:
  idemkey demo                                   300 intents, embedded SQLite, under a minute
  idemkey demo --intents 20 --workers 1          a few seconds
  idemkey demo --intents 1000 --workers 4 --drop-rate 10%
  idemkey demo --store postgres://root@127.0.0.1:5432/test
  idemkey demo --store redis://127.0.0.1:6379 --json

The bare API is expected to double-charge. The demo exits with code 1 when the protected API makes
any double charge, loses an intent or accepts a reused key.

The same --seed gives the same traffic, faults and retry jitter. Timing still varies: latencies and
run time always; and where a worker is killed (--crash-rate), which other requests die with it, so
the bare API's charges, HTTP attempts and restarts vary too. --crash-rate 0 makes the counts repeat.`,
    )
    .action(async (flags: DemoFlags) => {
      const rates = {
        drop: flags.dropRate,
        timeout: flags.timeoutRate,
        crash: flags.crashRate,
        double: flags.doubleRate,
        reuse: flags.reuseRate,
      }
      const sum = Object.values(rates).reduce((a, b) => a + b, 0)
      if (sum > 1)
        throw new CliError(
          `The fault rates add up to ${sum.toFixed(2)}; each intent gets at most one fault, so keep their sum at or below 1.`,
          2,
        )
      if (flags.lease < 100) throw new CliError('--lease must be at least 100ms.', 2)
      // Loaded only now: the demo brings the store, the engine and the payments API with it.
      const { runDemo } = await import('../demo/run-demo.js')
      const progress = createProgress(flags.intents)
      let report: DemoReport
      try {
        report = await runDemo({
          intents: flags.intents,
          rates,
          workers: flags.workers,
          store: flags.store,
          concurrency: flags.concurrency,
          seed: flags.seed,
          leaseMs: flags.lease,
          attemptTimeoutMs: flags.clientTimeout,
          onProgress: progress.update,
        })
      } finally {
        progress.stop()
      }
      if (flags.json) printJson(report)
      else process.stdout.write(renderReport(report))
      if (!report.passed) process.exitCode = 1
    })
}

/** A progress bar on stderr when it is a terminal; otherwise a plain line every 10%, readable in CI logs. */
function createProgress(total: number): { update: (api: ApiName, done: number, total: number) => void; stop: () => void } {
  if (process.stderr.isTTY) {
    const bar = progressLine(process.stderr)
    let current: ApiName | undefined
    return {
      update: (api, done) => {
        if (api !== current) {
          if (current) bar.stop()
          current = api
          bar.start(total, api.padEnd(9))
        }
        bar.update(done)
      },
      stop: () => bar.stop(),
    }
  }
  const step = Math.max(1, Math.ceil(total / 10))
  return {
    update: (api, done) => {
      if (done % step === 0 || done === total) process.stderr.write(`${api} API: ${done}/${total} intents\n`)
    },
    stop: () => {},
  }
}

function renderReport(report: DemoReport): string {
  const { bare, protected: guarded } = report
  const ms = (value: number) => `${Math.round(value)}ms`
  const rows: Array<[string, string | number, string | number]> = [
    ['intents', bare.intents, guarded.intents],
    ['HTTP attempts', bare.httpAttempts, guarded.httpAttempts],
    ['charges made', bare.chargesMade, guarded.chargesMade],
    ['double charges', bare.doubleCharges, guarded.doubleCharges],
    ['lost intents', bare.lostIntents, guarded.lostIntents],
    ['bank repeats refused by key', bare.bankRepeatsRefused, guarded.bankRepeatsRefused],
    ['stock / mail repeats refused by key', bare.stepRepeatsRefused, guarded.stepRepeatsRefused],
    [
      'double reservations / emails',
      `${bare.doubleReservations} / ${bare.doubleEmails}`,
      `${guarded.doubleReservations} / ${guarded.doubleEmails}`,
    ],
    ['checkout steps resumed', bare.stepsResumed, guarded.stepsResumed],
    ['key reuses rejected', `${bare.keyReusesRejected}/${bare.reuseAttempts}`, `${guarded.keyReusesRejected}/${guarded.reuseAttempts}`],
    ['clients that gave up', bare.clientGaveUp, guarded.clientGaveUp],
    ['workers killed and restarted', bare.workerRestarts, guarded.workerRestarts],
    ['intent latency p50', ms(bare.p50Ms), ms(guarded.p50Ms)],
    ['intent latency p99', ms(bare.p99Ms), ms(guarded.p99Ms)],
    ['run time', formatDuration(bare.seconds * 1000), formatDuration(guarded.seconds * 1000)],
  ]
  const f = report.faults
  const lease = formatDuration(report.leaseMs)
  const lines = [
    '',
    `idemkey demo: ${report.intents} payment intents, ${report.workers} worker(s) per API, store ${report.store}, seed ${report.seed}`,
    `faults: ${f.drop} responses lost after commit, ${f.timeout} client timeouts, ${f.crash} workers killed mid-request, ${f.double} double clicks, ${f.reuse} keys reused with another amount`,
    '',
    renderTable(['', 'bare API', 'behind idemkey'], rows),
    '',
    'What the rows count:',
    '  HTTP attempts         every request that reached the API: first sends, client retries, double clicks.',
    '  charges made          rows in the charges table; one per intent is right. Double charges are the extra ones.',
    '  bank repeats refused  a worker was killed after the bank charged, before idemkey stored the answer. After',
    `    by key              the lease (${lease}) another worker ran the request again, and the bank refused the repeat:`,
    '                        idemkey passes it a key derived from the Idempotency-Key (deriveKey). The bare API has',
    '                        no key to pass, so its retry charges again.',
    '  stock / mail repeats  the same for the other two steps: a worker killed after a reservation or an email, before',
    '    refused by key      its step was recorded (the request it was killed for, or another it was serving then).',
    '  steps resumed         a charge is a checkout of three steps (reserve, charge, email). Behind idemkey each is a',
    '                        durable step (ctx.step): a worker killed between steps leaves them recorded, and the',
    '                        takeover skips them. The bare API runs every step again.',
    "  key reuses rejected   a client sent an intent's key again with another amount: behind idemkey, a 422.",
    `  intent latency p99    higher behind idemkey when a worker is killed: its intent waits for the lease (${lease})`,
    '                        to end, since a slow holder and a dead one look alike until then; only then may another',
    '                        worker take it over. The bare API retries at once, and charges twice.',
    '',
    ...wrap(`Seed ${report.seed} fixes the traffic, the faults and the clients' retry jitter. ${report.repeatability.varies}`, 110),
    '',
  ]
  if (report.passed) {
    lines.push(
      `With idemkey: every intent charged exactly once${guarded.reuseAttempts ? ', every reused key refused with 422' : ''}.`,
      bare.doubleCharges > 0
        ? `Without it, the same traffic charged ${bare.doubleCharges} time(s) too many.`
        : 'The bare API made no double charge this time: raise the fault rates or --intents to see it.',
    )
  } else {
    lines.push('FAILED: the protected API double-charged, lost an intent or accepted a reused key. Please report this as a bug.')
  }
  return `${lines.join('\n')}\n`
}

/** Breaks a paragraph into lines of at most `width` characters, at spaces. */
function wrap(text: string, width: number): string[] {
  const lines: string[] = []
  let line = ''
  for (const word of text.split(' ')) {
    if (line && line.length + 1 + word.length > width) {
      lines.push(line)
      line = word
    } else line = line ? `${line} ${word}` : word
  }
  return line ? [...lines, line] : lines
}
