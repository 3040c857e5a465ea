/** Shared helpers for the benchmarks: timing loops, percentiles, markdown tables, writing results. */
import { mkdirSync, writeFileSync } from 'node:fs'
import { cpus } from 'node:os'
import { join } from 'node:path'

/**
 * A steady offered load: `producers` callers, staggered, each calling `produce` on its own schedule so
 * that together they offer `rate` calls a second for `seconds`. Returns how many calls were made and the
 * rate achieved (lower than offered when `produce` cannot keep up).
 */
export async function steadyLoad(
  rate: number,
  seconds: number,
  produce: (i: number) => Promise<void>,
  producers = 8,
): Promise<{ produced: number; achieved: number; elapsedMs: number }> {
  const end = performance.now() + seconds * 1_000
  const intervalMs = (1_000 * producers) / rate
  let produced = 0
  const started = performance.now()
  await Promise.all(
    Array.from({ length: producers }, async (_, p) => {
      let next = performance.now() + (p * intervalMs) / producers
      while (performance.now() < end) {
        const wait = next - performance.now()
        if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait))
        next += intervalMs
        await produce(produced++)
      }
    }),
  )
  const elapsedMs = performance.now() - started
  return { produced, achieved: produced / (elapsedMs / 1_000), elapsedMs }
}

/** Runs `op` in a loop for about `ms` (after a warm-up) with `concurrency` callers; returns ops/s. */
export async function opsPerSecond(op: (i: number) => Promise<unknown>, ms = 2_000, concurrency = 1): Promise<number> {
  let counter = 0
  const warmUntil = performance.now() + Math.min(300, ms / 4)
  while (performance.now() < warmUntil) await op(counter++)
  let done = 0
  const end = performance.now() + ms
  const start = performance.now()
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (performance.now() < end) {
        await op(counter++)
        done++
      }
    }),
  )
  return done / ((performance.now() - start) / 1_000)
}

/** A number given as `--name N` on the command line, or `fallback`. */
export function numberArg(name: string, fallback: number): number {
  const i = process.argv.indexOf(`--${name.replace(/^--/, '')}`)
  return i > 0 ? Number(process.argv[i + 1]) : fallback
}

/** The p-th percentile (0-100) of a list of numbers. */
export function percentile(values: number[], p: number): number {
  if (values.length === 0) return Number.NaN
  const sorted = [...values].sort((a, b) => a - b)
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)] as number
}

export function fmt(n: number, digits = 0): string {
  return n.toLocaleString('en-US', { maximumFractionDigits: digits, minimumFractionDigits: digits })
}

export function table(header: string[], rows: Array<Array<string | number>>): string {
  const line = (cells: Array<string | number>) => `| ${cells.join(' | ')} |`
  return [line(header), line(header.map(() => '---')), ...rows.map(line)].join('\n')
}

/** Prints the result and writes it to docs/benchmarks/<area>.md with the command and the machine. */
export function report(area: string, title: string, command: string, body: string): void {
  const machine = `${cpus().length} cores (${cpus()[0]?.model ?? 'unknown CPU'}), Node ${process.version}`
  const text = `## ${title}\n\nMeasured ${new Date().toISOString().slice(0, 10)} on ${machine} with \`${command}\`.\n\n${body}\n`
  console.log(text)
  const dir = join(import.meta.dirname, '..', 'docs', 'benchmarks')
  mkdirSync(dir, { recursive: true })
  writeFileSync(join(dir, `${area}.md`), text)
}
