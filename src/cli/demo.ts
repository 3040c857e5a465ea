import cliProgress from 'cli-progress'
import type { Command } from 'commander'
import { formatDuration } from '../core/duration.js'
import { type ApiName, type DemoReport, runDemo } from '../demo/run-demo.js'
import { durationArg, intArg, rateArg, storeArg } from './options.js'
import { printJson, renderTable } from './output.js'
import { CliError } from './run.js'

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
    .option(
      '--lease <duration>',
      "lease of the protected API's records (a crashed worker's intent is taken over after it)",
      durationArg('--lease'),
      2000,
    )
    .option('--client-timeout <duration>', 'per-attempt timeout of the clients', durationArg('--client-timeout'), 1000)
    .option('--seed <n>', 'seed of the traffic and faults', intArg('--seed', 0, 2 ** 31), 42)
    .option('--json', 'print the report as JSON instead of a table')
    .addHelpText(
      'after',
      `
Examples:
  idemkey demo                                   300 intents, embedded SQLite, under a minute
  idemkey demo --intents 1000 --workers 4 --drop-rate 10%
  idemkey demo --store postgres://root@127.0.0.1:5432/test
  idemkey demo --store redis://127.0.0.1:6379 --json

The bare API is expected to double-charge. The demo exits with code 1 when the protected API makes
any double charge, loses an intent or accepts a reused key.`,
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
    const bar = new cliProgress.SingleBar(
      { format: ' {api} API |{bar}| {value}/{total} intents', stream: process.stderr, hideCursor: true, clearOnComplete: false },
      cliProgress.Presets.shades_classic,
    )
    let current: ApiName | undefined
    return {
      update: (api, done) => {
        if (api !== current) {
          if (current) bar.stop()
          current = api
          bar.start(total, 0, { api: api.padEnd(9) })
        }
        bar.update(done, { api: api.padEnd(9) })
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
    ['key reuses rejected', `${bare.keyReusesRejected}/${bare.reuseAttempts}`, `${guarded.keyReusesRejected}/${guarded.reuseAttempts}`],
    ['clients that gave up', bare.clientGaveUp, guarded.clientGaveUp],
    ['workers killed and restarted', bare.workerRestarts, guarded.workerRestarts],
    ['intent latency p50', ms(bare.p50Ms), ms(guarded.p50Ms)],
    ['intent latency p99', ms(bare.p99Ms), ms(guarded.p99Ms)],
    ['run time', formatDuration(bare.seconds * 1000), formatDuration(guarded.seconds * 1000)],
  ]
  const f = report.faults
  const lines = [
    '',
    `idemkey demo: ${report.intents} payment intents, ${report.workers} worker(s) per API, store ${report.store}, seed ${report.seed}`,
    `faults: ${f.drop} responses lost after commit, ${f.timeout} client timeouts, ${f.crash} workers killed mid-request, ${f.double} double clicks, ${f.reuse} keys reused with another amount`,
    '',
    renderTable(['', 'bare API', 'behind idemkey'], rows),
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
