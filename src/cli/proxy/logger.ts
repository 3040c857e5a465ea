/**
 * The proxy's logger: JSON lines on stderr (stdout carries only the listening line), or a compact human
 * format on a terminal. Each line: `{"level":"info","time":"<ISO>","name":"idemkey","pid":1,…fields,"msg":"…"}`.
 * Loaded only by `idemkey proxy`.
 */

/** Levels `--log-level` takes, quietest last. */
export const LOG_LEVELS = ['trace', 'debug', 'info', 'warn', 'error', 'fatal', 'silent'] as const
export type LogLevel = (typeof LOG_LEVELS)[number]
export type LogFormat = 'json' | 'pretty'
type Level = Exclude<LogLevel, 'silent'>

/** A line's extra fields; `err` may be an Error (written as its type, message and stack). */
export type LogFields = object

/** What the proxy logs through: a line per call at or above the logger's level. */
export interface Logger {
  trace(fields: LogFields | string, msg?: string): void
  debug(fields: LogFields | string, msg?: string): void
  info(fields: LogFields | string, msg?: string): void
  warn(fields: LogFields | string, msg?: string): void
  error(fields: LogFields | string, msg?: string): void
  fatal(fields: LogFields | string, msg?: string): void
  isLevelEnabled(level: Level): boolean
  /** Writes what is gathered, then calls `cb`. */
  flush(cb?: (error?: Error) => void): void
}

/** Options of {@link createLogger}. */
export interface LoggerOptions {
  level: LogLevel
  /** @default 'pretty' when `stream` is a terminal, else 'json' */
  format?: LogFormat
  /** Where lines go. @default process.stderr */
  stream?: NodeJS.WritableStream & { isTTY?: boolean }
}

/** The proxy's two loggers: `access` for the per-request lines, `log` for everything else. */
export interface ProxyLoggers {
  log: Logger
  /** Access lines; on stderr gathered into fewer writes (see {@link LOG_FLUSH_MS}), never after a later `log` line. */
  access: Logger
}

/** Where a logger's lines go. */
interface Destination {
  write(line: string): void
  flush?(cb?: (error?: Error) => void): void
}

const RANK: Record<LogLevel, number> = { trace: 10, debug: 20, info: 30, warn: 40, error: 50, fatal: 60, silent: Number.POSITIVE_INFINITY }

/**
 * Loggers with idemkey's base fields (`name: "idemkey"`, `pid`), ISO times and level names.
 *
 * @example const { log, access } = createLogger({ level: 'info' }); access.info({ keyHash }, 'request')
 */
export function createLogger(options: LoggerOptions): ProxyLoggers {
  const stream = options.stream ?? process.stderr
  const format = options.format ?? (stream.isTTY ? 'pretty' : 'json')
  if (format === 'pretty' || stream !== process.stderr) {
    const log = jsonLogger(options.level, { write: (line: string) => void stream.write(format === 'pretty' ? prettyLine(line) : line) })
    return { log, access: log }
  }
  const gate = stderrGate()
  return { log: jsonLogger(options.level, gate.now), access: jsonLogger(options.level, gate.gathered) }
}

function jsonLogger(level: LogLevel, destination: Destination): Logger {
  const threshold = RANK[level]
  // Fixed for the process: written once into every line.
  const base = `,"name":"idemkey","pid":${process.pid}`
  const at = (name: Level) => {
    if (RANK[name] < threshold) return () => {}
    const head = `{"level":"${name}","time":"`
    return (fields: LogFields | string, msg?: string) => {
      let line = `${head}${new Date().toISOString()}"${base}`
      let text = msg
      if (typeof fields === 'string') text = fields
      else {
        for (const key in fields) {
          const value = (fields as Record<string, unknown>)[key]
          if (value === undefined) continue
          line += `,${JSON.stringify(key)}:${JSON.stringify(key === 'err' && value instanceof Error ? errorFields(value) : value)}`
        }
      }
      destination.write(text === undefined ? `${line}}\n` : `${line},"msg":${JSON.stringify(text)}}\n`)
    }
  }
  return {
    trace: at('trace'),
    debug: at('debug'),
    info: at('info'),
    warn: at('warn'),
    error: at('error'),
    fatal: at('fatal'),
    isLevelEnabled: (name) => RANK[name] >= threshold,
    flush: (cb) => (destination.flush ? destination.flush(cb) : cb?.()),
  }
}

function errorFields(error: Error): { type: string; message: string; stack?: string } {
  return { type: error.name, message: error.message, stack: error.stack }
}

/** How long an access line may wait before it is written. */
export const LOG_FLUSH_MS = 100

/**
 * stderr with the access lines gathered up to 4 KiB and written at least every {@link LOG_FLUSH_MS} and
 * at exit: one write per line cost the proxy about 8 µs a request under load (a `write` system call each);
 * now many lines share one. Every other line (store down and back, UNRECORDED outcomes, errors) is written
 * at once, after what was gathered before it, so lines stay in order. Writes go through `process.stderr`,
 * which Node writes synchronously to files and pipes, so such a line is out before the response that
 * follows it. `flush()` (`logger.flush()`, the proxy's drain) empties it.
 */
function stderrGate(): { now: Destination; gathered: Destination } {
  let gathered = ''
  const flush = () => {
    if (gathered === '') return
    const out = gathered
    gathered = ''
    process.stderr.write(out)
  }
  const timer = setInterval(flush, LOG_FLUSH_MS)
  timer.unref()
  process.once('exit', flush)
  const flushable = {
    flush(cb?: (error?: Error) => void) {
      flush()
      cb?.()
    },
  }
  return {
    now: {
      ...flushable,
      write(line: string) {
        const out = gathered + line
        gathered = ''
        process.stderr.write(out)
      },
    },
    gathered: {
      ...flushable,
      write(line: string) {
        gathered += line
        if (gathered.length >= 4096) flush()
      },
    },
  }
}

const COLORS: Partial<Record<Level, string>> = { trace: '90', debug: '36', info: '32', warn: '33', error: '31', fatal: '35' }
const SKIP = new Set(['level', 'time', 'msg', 'pid', 'hostname', 'name'])

/**
 * One JSON log line as a terminal reader wants it: `12:00:01.234 INFO  msg key=value …`, coloured by level.
 *
 * @example prettyLine('{"level":"info","time":"…","msg":"request","status":201}\n') // '12:00:01.234 INFO  request status=201\n'
 */
export function prettyLine(line: string): string {
  let entry: Record<string, unknown>
  try {
    entry = JSON.parse(line) as Record<string, unknown>
  } catch {
    return line
  }
  const level = String(entry.level ?? 'info') as Level
  const time = typeof entry.time === 'string' ? entry.time.slice(11, 23) : ''
  const fields = Object.entries(entry)
    .filter(([name]) => !SKIP.has(name))
    .map(([name, value]) => `${name}=${typeof value === 'string' && !/\s/.test(value) ? value : JSON.stringify(value)}`)
    .join(' ')
  const color = COLORS[level] ?? '0'
  return `${time} \u001b[${color}m${level.toUpperCase().padEnd(5)}\u001b[0m ${entry.msg ?? ''}${fields ? ` ${fields}` : ''}\n`
}
