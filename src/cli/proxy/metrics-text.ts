/**
 * Prometheus metrics in the text exposition format (0.0.4), written directly: counters, gauges
 * (optionally read at scrape time) and histograms with labels, and the `process_*`/`nodejs_*` basics.
 */
import { readdirSync, readFileSync } from 'node:fs'
import { monitorEventLoopDelay } from 'node:perf_hooks'

type Labels = Record<string, string>

/** One metric: its HELP/TYPE head and its samples, as text. */
interface Metric {
  text(): Promise<string> | string
}

const escapeLabel = (value: string) => value.replace(/\\/g, '\\\\').replace(/\n/g, '\\n').replace(/"/g, '\\"')
const labelText = (labels: Labels) => {
  const pairs = Object.entries(labels).map(([name, value]) => `${name}="${escapeLabel(value)}"`)
  return pairs.length > 0 ? `{${pairs.join(',')}}` : ''
}
/** A label set's key in a metric's map: its values in order (each metric passes its labels in one order). */
const cellKey = (labels: Labels) => {
  let key = ''
  for (const name in labels) key += `${labels[name]}\u0000`
  return key
}
const head = (name: string, help: string, type: string) =>
  `# HELP ${name} ${help.replace(/\\/g, '\\\\').replace(/\n/g, '\\n')}\n# TYPE ${name} ${type}\n`

/** The metrics of one `/metrics` page. */
export class Registry {
  readonly contentType = 'text/plain; version=0.0.4; charset=utf-8'
  readonly #metrics: Metric[] = []

  register<M extends Metric>(metric: M): M {
    this.#metrics.push(metric)
    return metric
  }

  /** The page: every metric, in the order registered. */
  async metrics(): Promise<string> {
    const parts = await Promise.all(this.#metrics.map((m) => m.text()))
    return parts.join('')
  }
}

/** A value per label set (a counter or a gauge). */
class Values implements Metric {
  readonly #values = new Map<string, { labels: Labels; value: number }>()
  constructor(
    readonly name: string,
    readonly help: string,
    readonly type: 'counter' | 'gauge',
    readonly collect?: (metric: Values) => Promise<void> | void,
  ) {}

  /** The cell of a label set, made once: callers keep it, so a hot path hashes no labels. */
  cell(labels: Labels = {}): { value: number } {
    const key = cellKey(labels)
    let cell = this.#values.get(key)
    if (cell === undefined) {
      cell = { labels, value: 0 }
      this.#values.set(key, cell)
    }
    return cell
  }

  reset(): void {
    this.#values.clear()
  }

  async text(): Promise<string> {
    await this.collect?.(this)
    let out = head(this.name, this.help, this.type)
    for (const { labels, value } of this.#values.values()) out += `${this.name}${labelText(labels)} ${value}\n`
    return out
  }
}

export function counter(name: string, help: string): Values {
  return new Values(name, help, 'counter')
}

export function gauge(name: string, help: string, collect?: (metric: Values) => Promise<void> | void): Values {
  return new Values(name, help, 'gauge', collect)
}

/** A histogram's series of one label set. */
export interface HistogramCell {
  observe(value: number): void
}

/** A histogram's series of one label set: cumulative counts per bucket, as the page shows them. */
class HistogramSeries implements HistogramCell {
  readonly counts: number[]
  sum = 0
  count = 0
  constructor(
    readonly labels: Labels,
    readonly buckets: readonly number[],
  ) {
    this.counts = buckets.map(() => 0)
  }

  observe(value: number): void {
    for (let i = 0; i < this.buckets.length; i++) if (value <= (this.buckets[i] as number)) (this.counts[i] as number)++
    this.sum += value
    this.count++
  }
}

/** A histogram with fixed buckets (upper bounds, ascending). */
export class Histogram implements Metric {
  readonly #cells = new Map<string, HistogramSeries>()
  constructor(
    readonly name: string,
    readonly help: string,
    readonly buckets: readonly number[],
  ) {}

  /** The series of a label set, made once and kept. */
  cell(labels: Labels = {}): HistogramCell {
    const key = cellKey(labels)
    let cell = this.#cells.get(key)
    if (cell === undefined) {
      cell = new HistogramSeries(labels, this.buckets)
      this.#cells.set(key, cell)
    }
    return cell
  }

  text(): string {
    let out = head(this.name, this.help, 'histogram')
    for (const { labels, counts, sum, count } of this.#cells.values()) {
      for (let i = 0; i < this.buckets.length; i++) {
        out += `${this.name}_bucket${labelText({ le: String(this.buckets[i]), ...labels })} ${counts[i]}\n`
      }
      out += `${this.name}_bucket${labelText({ le: '+Inf', ...labels })} ${count}\n`
      out += `${this.name}_sum${labelText(labels)} ${sum}\n${this.name}_count${labelText(labels)} ${count}\n`
    }
    return out
  }
}

/** Node's process metrics under prom-client's default names (CPU, memory, file descriptors, event loop, heap, version). */
export function registerProcessMetrics(registry: Registry): void {
  const startSeconds = Math.round(Date.now() / 1000 - process.uptime())
  const loop = monitorEventLoopDelay({ resolution: 10 })
  loop.enable()
  const set = (metric: Values, value: number, labels?: Labels) => {
    metric.cell(labels).value = value
  }
  // Read once per scrape: the page's gauges are collected in one synchronous pass, so a reading kept
  // until the next microtask serves all of them (three CPU and three heap gauges).
  const perScrape = <T>(read: () => T) => {
    let reading: { value: T } | undefined
    return (): T => {
      if (reading === undefined) {
        reading = { value: read() }
        queueMicrotask(() => {
          reading = undefined
        })
      }
      return reading.value
    }
  }
  const cpu = perScrape(() => process.cpuUsage())
  const memory = perScrape(() => process.memoryUsage())
  const add = (metric: Values, update: (metric: Values) => void) =>
    registry.register(new Values(metric.name, metric.help, metric.type, update))
  add(counter('process_cpu_user_seconds_total', 'Total user CPU time spent in seconds.'), (m) => set(m, cpu().user / 1e6))
  add(counter('process_cpu_system_seconds_total', 'Total system CPU time spent in seconds.'), (m) => set(m, cpu().system / 1e6))
  add(counter('process_cpu_seconds_total', 'Total user and system CPU time spent in seconds.'), (m) => {
    const { user, system } = cpu()
    set(m, (user + system) / 1e6)
  })
  add(gauge('process_start_time_seconds', 'Start time of the process since unix epoch in seconds.'), (m) => set(m, startSeconds))
  add(gauge('process_resident_memory_bytes', 'Resident memory size in bytes.'), (m) => set(m, memory().rss))
  add(gauge('process_open_fds', 'Number of open file descriptors.'), (m) => {
    try {
      set(m, readdirSync('/proc/self/fd').length - 1)
    } catch {
      m.reset()
    }
  })
  add(gauge('process_max_fds', 'Maximum number of open file descriptors.'), (m) => {
    try {
      const limit = /Max open files\s+(\d+)/.exec(readFileSync('/proc/self/limits', 'utf8'))?.[1]
      if (limit !== undefined) set(m, Number(limit))
    } catch {
      m.reset()
    }
  })
  add(gauge('nodejs_eventloop_lag_p50_seconds', 'The 50th percentile of the recorded event loop delays.'), (m) =>
    set(m, loop.percentile(50) / 1e9),
  )
  add(gauge('nodejs_eventloop_lag_p99_seconds', 'The 99th percentile of the recorded event loop delays.'), (m) =>
    set(m, loop.percentile(99) / 1e9),
  )
  add(gauge('nodejs_eventloop_lag_max_seconds', 'The maximum recorded event loop delay.'), (m) => set(m, loop.max / 1e9))
  add(gauge('nodejs_heap_size_total_bytes', 'Process heap size from Node.js in bytes.'), (m) => set(m, memory().heapTotal))
  add(gauge('nodejs_heap_size_used_bytes', 'Process heap size used from Node.js in bytes.'), (m) => set(m, memory().heapUsed))
  add(gauge('nodejs_external_memory_bytes', 'Node.js external memory size in bytes.'), (m) => set(m, memory().external))
  add(gauge('nodejs_active_resources_total', 'Total number of active resources.'), (m) => set(m, process.getActiveResourcesInfo().length))
  const [major, minor, patch] = process.versions.node.split('.')
  add(gauge('nodejs_version_info', 'Node.js version info.'), (m) =>
    set(m, 1, { version: process.version, major: major ?? '', minor: minor ?? '', patch: patch ?? '' }),
  )
}
