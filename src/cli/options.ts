import { parseDuration, parseTimerDuration } from '../core/duration.js'
import { redactUrl } from '../core/redact-url.js'
import { isIdempotencyError } from '../errors.js'
import { InvalidArgumentError, Option } from './program.js'
import { CliError } from './run.js'
import { DEFAULT_STORE_URL, parseStoreUrl } from './store-url.js'

/** Help text of `--store`, shared by every command that opens one. */
export const STORE_HELP =
  'store URL: memory:, sqlite:PATH, postgres://USER@HOST:PORT/DB, mysql://…, redis://HOST:PORT; add ?table=NAME (and ?schema=NAME on PostgreSQL, ?prefix=P on Redis) when your app does not use the defaults'

/** The environment variable every command reads its store from when `--store` is not given. */
export const STORE_ENV = 'IDEMKEY_STORE'

/**
 * The `--store` option of the operator commands: from the flag, else `$IDEMKEY_STORE`, else the
 * default SQLite file (which the read and purge commands only open when it exists).
 */
export function storeOption(): Option {
  return new Option('--store <url>', STORE_HELP).argParser(storeArg).default(DEFAULT_STORE_URL).env(STORE_ENV)
}

/**
 * A commander parser for a URL that may carry a password. commander quotes a refused value whole in its
 * message ("argument 'postgres://app:s3cret@…' is invalid"), so a URL with a password is refused by
 * the CLI's own error instead, with the URL masked (the parser's own message masks it too).
 *
 * @example new Option('--to <url>').argParser(urlArg('--to <url>', toArg))
 */
export function urlArg<T>(flags: string, parse: (value: string) => T): (value: string) => T {
  return (value) => {
    try {
      return parse(value)
    } catch (error) {
      const shown = redactUrl(value)
      if (!(error instanceof InvalidArgumentError) || shown === value) throw error
      throw new CliError(`option '${flags}' argument '${shown}' is invalid. ${error.message}`, 1, true)
    }
  }
}

/** Why a timeout flag refuses 0: the servers and clients below read a timeout of 0 as none at all. */
export const TIMEOUT_OF_ZERO = 'a timeout of 0 would turn the bound off; give a long one instead, e.g. 10m'

/**
 * A commander parser for a duration flag (`30s`, `5m`, `1h30m`, or milliseconds); returns milliseconds.
 * With `positive` (the reason 0 will not do), 0 is refused. A `timer` (a timeout the server, undici or
 * a socket arms as one Node timer) is refused past 24.8 days, where Node would fire it after 1 ms.
 *
 * @example new Option('--lease <duration>').argParser(durationArg('--lease'))
 */
export function durationArg(flag: string, positive?: string, timer = false): (value: string) => number {
  return (value) => {
    let ms: number
    try {
      ms = timer ? parseTimerDuration(value, flag) : parseDuration(value, flag)
    } catch (error) {
      throw new InvalidArgumentError(
        isIdempotencyError(error) ? error.message : `expected a duration such as 30s, 5m or 24h, got "${value}".`,
      )
    }
    if (positive !== undefined && ms <= 0) throw new InvalidArgumentError(`${flag} must be longer than 0: ${positive}.`)
    return ms
  }
}

/** The long flag of an option's flags (`--ttl` of `--ttl <duration>`), for messages. */
function longFlag(flags: string): string {
  return /--[\w-]+/.exec(flags)?.[0] ?? flags
}

/**
 * A duration option whose default is written as users write it, so `--help` shows `default: 24h`
 * rather than the 86400000 it parses to.
 *
 * @example program.addOption(durationOption('--ttl <duration>', 'how long outcomes are replayed', '24h'))
 */
export function durationOption(flags: string, description: string, defaultValue: string, positive?: string, timer = false): Option {
  const parse = durationArg(longFlag(flags), positive, timer)
  return new Option(flags, description).argParser(parse).default(parse(defaultValue), defaultValue)
}

/**
 * A size option whose default is written as users write it (`1mb`, not 1048576).
 *
 * @example program.addOption(sizeOption('--max-body <size>', 'largest request body', '1mb'))
 */
export function sizeOption(flags: string, description: string, defaultValue: string): Option {
  const parse = sizeArg(longFlag(flags))
  return new Option(flags, description).argParser(parse).default(parse(defaultValue), defaultValue)
}

/** A commander parser for a store URL: checks its shape now, so a typo fails before anything starts. */
export const storeArg = urlArg('--store <url>', (value) => {
  try {
    parseStoreUrl(value)
    return value
  } catch (error) {
    throw new InvalidArgumentError((error as Error).message)
  }
})

/**
 * A commander parser for an address to listen on: an empty one (an unset variable in `--host "$HOST"`)
 * would make Node listen on every interface, the opposite of the loopback default, so it is refused.
 */
export function hostArg(flag: string): (value: string) => string {
  return (value) => {
    const host = value.trim()
    if (host === '' || /\s/.test(host)) {
      throw new InvalidArgumentError(
        `${flag} is an address to listen on, e.g. 127.0.0.1 (this machine only) or 0.0.0.0 (every interface), got "${value}".`,
      )
    }
    return host
  }
}

/** A commander parser for an integer within bounds. */
export function intArg(flag: string, min: number, max = Number.MAX_SAFE_INTEGER): (value: string) => number {
  return (value) => {
    const parsed = Number(value)
    if (!/^\d+$/.test(value.trim()) || parsed < min || parsed > max) {
      throw new InvalidArgumentError(`${flag} expects a whole number from ${min} to ${max}, got "${value}".`)
    }
    return parsed
  }
}

/** A commander parser for a positive number (`5000`, `12.5`, `5k`). */
export function positiveArg(flag: string): (value: string) => number {
  return (value) => {
    const match = /^(\d+(?:\.\d+)?)(k|m)?$/i.exec(value.trim())
    const parsed = match ? Number(match[1]) * (match[2]?.toLowerCase() === 'k' ? 1e3 : match[2] ? 1e6 : 1) : Number.NaN
    if (!(parsed > 0) || !Number.isFinite(parsed)) {
      throw new InvalidArgumentError(`${flag} expects a positive number such as 5000, 12.5 or 5k, got "${value}".`)
    }
    return parsed
  }
}

/** A commander parser for a rate: a fraction from 0 to 1 (`0.05`) or a percentage (`5%`). */
export function rateArg(flag: string): (value: string) => number {
  return (value) => {
    const text = value.trim()
    const parsed = text.endsWith('%') ? Number(text.slice(0, -1)) / 100 : Number(text)
    if (text === '' || !Number.isFinite(parsed) || parsed < 0 || parsed > 1) {
      throw new InvalidArgumentError(`${flag} expects a rate from 0 to 1 (e.g. 0.05) or a percentage (e.g. 5%), got "${value}".`)
    }
    return parsed
  }
}

/** A commander parser for a comma-separated list of HTTP methods. */
export function methodsArg(value: string): string[] {
  const methods = value
    .split(',')
    .map((m) => m.trim().toUpperCase())
    .filter((m) => m.length > 0)
  if (methods.length === 0 || methods.some((m) => !/^[A-Z]+$/.test(m))) {
    throw new InvalidArgumentError(`expected HTTP methods separated by commas, e.g. POST,PATCH; got "${value}".`)
  }
  return methods
}

const SIZE_UNITS: Record<string, number> = {
  '': 1,
  b: 1,
  kb: 1024,
  kib: 1024,
  mb: 1024 ** 2,
  mib: 1024 ** 2,
  gb: 1024 ** 3,
  gib: 1024 ** 3,
}

/** A commander parser for a size in bytes: `1048576`, `512kb`, `1mb` (binary units). */
export function sizeArg(flag: string): (value: string) => number {
  return (value) => {
    const match = /^(\d+(?:\.\d+)?)\s*([a-z]*)$/i.exec(value.trim())
    const unit = SIZE_UNITS[(match?.[2] ?? '').toLowerCase()]
    if (!match || unit === undefined) {
      throw new InvalidArgumentError(`${flag} expects a size such as 1048576, 512kb or 1mb, got "${value}".`)
    }
    return Math.floor(Number(match[1]) * unit)
  }
}

/** Levels of `--log-level`, quietest last. */
const LOG_LEVEL_CHOICES = ['trace', 'debug', 'info', 'warn', 'error', 'fatal', 'silent']

/** `--log-level`: what the proxy logs (`info` includes one access line per request). */
export function logLevelOption(): Option {
  return new Option('--log-level <level>', 'log this level and above; info logs one line per request, warn only trouble')
    .choices(LOG_LEVEL_CHOICES)
    .default('info')
    .env('IDEMKEY_LOG_LEVEL')
}

/** `--log-format`: JSON lines, or the compact human form (the default on a terminal). */
export function logFormatOption(): Option {
  return new Option('--log-format <format>', 'json lines, or pretty (default: pretty on a terminal, else json)').choices(['json', 'pretty'])
}
