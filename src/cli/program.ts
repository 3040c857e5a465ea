/**
 * The CLI's command-line parser: commands, options, arguments and `--help`, on `node:util` parseArgs.
 * It speaks the small part of commander's interface the commands use (`command()`, `option()`,
 * `addOption(new Option(…).argParser().default().env().choices())`, `argument()`, `action()`), and
 * prints the help and the errors commander printed (`error: unknown option '--x'`, the `--help` hint),
 * so the CLI needs no package besides idemkey itself.
 */
import { parseArgs } from 'node:util'
import { CliError } from './run.js'

/** Thrown by an option's parser for a value it refuses: reported as `option '…' argument '…' is invalid. <message>`. */
export class InvalidArgumentError extends Error {
  override name = 'InvalidArgumentError' as const
}

type Parser = (value: string) => unknown

/** One option: its flags (`-y, --yes`, `--store <url>`, `--no-setup`), help text, parser, default and variable. */
export class Option {
  readonly flags: string
  readonly description: string
  readonly long: string
  readonly short: string | undefined
  /** The key of the parsed options (`--dry-run` is `dryRun`, `--no-setup` is `setup`). */
  readonly attribute: string
  /** Takes a value (`--store <url>`), rather than being a switch (`--json`). */
  readonly takesValue: boolean
  /** `--no-X`: sets X to false; X is true unless given. */
  readonly negate: boolean
  mandatory = false
  defaultValue: unknown
  defaultDescription: string | undefined
  envVar: string | undefined
  choiceList: readonly string[] | undefined
  parser: Parser | undefined

  constructor(flags: string, description = '') {
    this.flags = flags
    this.description = description
    this.long = /--[\w-]+/.exec(flags)?.[0] ?? flags
    this.short = /(?:^|[\s,])(-\w)(?:[\s,]|$)/.exec(flags)?.[1]
    this.takesValue = /[<[]/.test(flags)
    this.negate = this.long.startsWith('--no-')
    this.attribute = camelCase(this.long.slice(this.negate ? 5 : 2))
  }

  argParser(parser: Parser): this {
    this.parser = parser
    return this
  }

  /** The value when the option is not given; `description` is how `--help` shows it (`24h`, not 86400000). */
  default(value: unknown, description?: string): this {
    this.defaultValue = value
    this.defaultDescription = description
    return this
  }

  /** Read from this environment variable when the flag is not given. */
  env(name: string): this {
    this.envVar = name
    return this
  }

  choices(values: readonly string[]): this {
    this.choiceList = values
    this.parser = (value) => {
      if (!values.includes(value)) throw new InvalidArgumentError(`Allowed choices are ${values.join(', ')}.`)
      return value
    }
    return this
  }

  makeOptionMandatory(): this {
    this.mandatory = true
    return this
  }

  /** The description `--help` shows, with its choices, default and variable. */
  helpText(): string {
    const extra: string[] = []
    if (this.choiceList) extra.push(`choices: ${this.choiceList.map((c) => JSON.stringify(c)).join(', ')}`)
    if (this.defaultValue !== undefined && (this.takesValue || typeof this.defaultValue === 'boolean')) {
      extra.push(`default: ${this.defaultDescription ?? JSON.stringify(this.defaultValue)}`)
    }
    if (this.envVar !== undefined) extra.push(`env: ${this.envVar}`)
    if (extra.length === 0) return this.description
    return this.description ? `${this.description} (${extra.join(', ')})` : `(${extra.join(', ')})`
  }
}

interface Argument {
  name: string
  required: boolean
  description: string
}

type Action = (...args: never[]) => unknown

const HELP = new Option('-h, --help', 'display help for command')
const HELP_FLAGS = new Set(['-h', '--help'])

/** A command (or the program itself) with its options, arguments, help text and action. */
export class Command {
  private commandName = ''
  private text = ''
  private readonly args: Argument[] = []
  private readonly options: Option[] = []
  private readonly after: string[] = []
  private readonly commands: Command[] = []
  private handler: Action | undefined
  private versionText: string | undefined
  private parent: Command | undefined

  name(name: string): this {
    this.commandName = name
    return this
  }

  description(text: string): this {
    this.text = text
    return this
  }

  /** `-v, --version` prints `version` (the program only). */
  version(version: string, flags = '-v, --version'): this {
    this.versionText = version
    this.options.unshift(new Option(flags, 'output the version number'))
    return this
  }

  /** A subcommand; returns it, to be described. */
  command(name: string): Command {
    const sub = new Command().name(name)
    sub.parent = this
    this.commands.push(sub)
    return sub
  }

  /** `<name>` (required) or `[name]` (optional). */
  argument(spec: string, description = ''): this {
    this.args.push({ name: spec.slice(1, -1), required: spec.startsWith('<'), description })
    return this
  }

  option(flags: string, description: string, parserOrDefault?: Parser | unknown, defaultValue?: unknown): this {
    const option = new Option(flags, description)
    if (typeof parserOrDefault === 'function') option.argParser(parserOrDefault as Parser).default(defaultValue)
    else option.default(parserOrDefault)
    return this.addOption(option)
  }

  requiredOption(flags: string, description: string, parser?: Parser, defaultValue?: unknown): this {
    const option = new Option(flags, description).makeOptionMandatory()
    if (parser) option.argParser(parser)
    return this.addOption(option.default(defaultValue))
  }

  addOption(option: Option): this {
    this.options.push(option)
    return this
  }

  /** Text printed after the generated help (examples). */
  addHelpText(_position: 'after', text: string): this {
    this.after.push(text)
    return this
  }

  action(handler: Action): this {
    this.handler = handler
    return this
  }

  /** Parses `argv` (`process.argv`: node and the script first) and runs the command it names. */
  async parseAsync(argv: readonly string[]): Promise<void> {
    await this.run(argv.slice(2))
  }

  private fullName(): string {
    return this.parent ? `${this.parent.fullName()} ${this.commandName}` : this.commandName
  }

  private async run(args: string[]): Promise<void> {
    if (this.commands.length > 0) return this.dispatch(args)
    const { values, operands, unknown } = this.parseOptions(args)
    if (unknown.some((arg) => HELP_FLAGS.has(arg))) return this.printHelp()
    for (const option of this.options) {
      if (option.mandatory && values[option.attribute] === undefined) {
        throw usage(`required option '${option.flags}' not specified`)
      }
    }
    if (unknown.length > 0) throw this.unknownOption(unknown[0] as string)
    const missing = this.args.find((arg, i) => arg.required && operands[i] === undefined)
    if (missing) throw usage(`missing required argument '${missing.name}'`)
    if (operands.length > this.args.length) {
      const expected = this.args.length
      throw usage(
        `too many arguments for '${this.commandName}'. Expected ${expected} argument${expected === 1 ? '' : 's'} but got ${operands.length}.`,
      )
    }
    const positional = this.args.map((_, i) => operands[i])
    await (this.handler as (...args: unknown[]) => unknown)(...positional, values, this)
  }

  /** The program: `-v`, `-h` and `help [command]` of its own, else the command its first operand names. */
  private async dispatch(args: string[]): Promise<void> {
    const isVersion = (arg: string) => this.versionText !== undefined && (arg === '-v' || arg === '--version')
    // Before the command's name: the program's own flags; any other option is unknown to it.
    let index = 0
    const first = args[0]
    if (first !== undefined) {
      if (isVersion(first)) return void process.stdout.write(`${this.versionText}\n`)
      if (HELP_FLAGS.has(first)) return this.printHelp()
      if (first === '--') index = 1
      else if (first.startsWith('-') && first !== '-') throw this.unknownOption(first)
    }
    const name = args[index]
    if (name === undefined) return this.printHelp(true)
    const rest = args.slice(index + 1)
    // As commander: the program's own -v is still seen after the command, up to the first other option.
    for (const arg of rest) {
      if (isVersion(arg)) return void process.stdout.write(`${this.versionText}\n`)
      if (arg.startsWith('-')) break
    }
    if (name === 'help') {
      const named = this.commands.find((c) => c.commandName === rest[0])
      return named ? named.printHelp() : this.printHelp(rest[0] !== undefined)
    }
    await this.find(name).run(rest)
  }

  private find(name: string): Command {
    const found = this.commands.find((c) => c.commandName === name)
    if (found) return found
    throw usage(`unknown command '${name}'${suggest(name, [...this.commands.map((c) => c.commandName), 'help'])}`)
  }

  private unknownOption(arg: string): CliError {
    const candidates = [...this.options, HELP, ...(this.parent?.options ?? [])].map((o) => o.long)
    return usage(`unknown option '${arg}'${suggest(arg, candidates)}`)
  }

  /**
   * The options in `args`, parsed in order (a refused value fails at once), then from their variables,
   * then defaults. From the first option this command does not know, the rest is left unparsed, as
   * commander leaves it (`--help` is one such).
   */
  private parseOptions(args: string[]): { values: Record<string, unknown>; operands: string[]; unknown: string[] } {
    const byName = new Map<string, Option>()
    const config: Record<string, { type: 'string' | 'boolean'; short?: string }> = {}
    for (const option of this.options) {
      const key = option.long.slice(2)
      byName.set(key, option)
      config[key] = option.short
        ? { type: option.takesValue ? 'string' : 'boolean', short: option.short.slice(1) }
        : { type: option.takesValue ? 'string' : 'boolean' }
    }
    const { tokens } = parseArgs({ args, options: config, strict: false, allowPositionals: true, tokens: true })
    const values: Record<string, unknown> = {}
    const given = new Set<string>()
    const operands: string[] = []
    let unknown: string[] = []
    for (const token of tokens) {
      if (token.kind === 'positional') {
        operands.push(token.value)
        continue
      }
      if (token.kind === 'option-terminator') {
        operands.push(...args.slice(token.index + 1))
        break
      }
      const option = byName.get(token.name)
      if (option === undefined || (!option.takesValue && token.value !== undefined)) {
        unknown = args.slice(token.index)
        break
      }
      given.add(option.attribute)
      if (!option.takesValue) {
        values[option.attribute] = !option.negate
        continue
      }
      if (token.value === undefined) throw usage(`option '${option.flags}' argument missing`)
      values[option.attribute] = parseValue(option, token.value, `option '${option.flags}' argument '${token.value}' is invalid.`)
    }
    for (const option of this.options) {
      const fromEnv = option.envVar === undefined ? undefined : process.env[option.envVar]
      if (!given.has(option.attribute) && fromEnv !== undefined && option.takesValue) {
        given.add(option.attribute)
        values[option.attribute] = parseValue(
          option,
          fromEnv,
          `option '${option.flags}' value '${fromEnv}' from env '${option.envVar}' is invalid.`,
        )
      }
    }
    for (const option of this.options) {
      if (given.has(option.attribute) || values[option.attribute] !== undefined) continue
      if (option.negate) values[option.attribute] = true
      else if (option.defaultValue !== undefined) values[option.attribute] = option.defaultValue
    }
    return { values, operands, unknown }
  }

  /** The help, on stdout (on stderr, as a usage error, when the program was run with no command). */
  private printHelp(error = false): void {
    const width = !error && process.stdout.isTTY ? process.stdout.columns || 80 : 80
    const text = `${formatHelp(this.help(), width)}${this.after.map((t) => `${t}\n`).join('')}`
    if (error) {
      process.stderr.write(text)
      process.exitCode = 1
    } else process.stdout.write(text)
  }

  private help(): HelpModel {
    const options = [...this.options, HELP]
    const args = this.args.map((a) => (a.required ? `<${a.name}>` : `[${a.name}]`))
    const commands = this.commands.map((c) => ({
      term: [c.commandName, '[options]', ...c.args.map((a) => (a.required ? `<${a.name}>` : `[${a.name}]`))].filter(Boolean).join(' '),
      description: c.text,
    }))
    if (commands.length > 0) commands.push({ term: 'help [command]', description: 'display help for command' })
    return {
      usage: [this.fullName(), '[options]', ...(commands.length > 0 ? ['[command]'] : []), ...args].join(' '),
      description: this.text,
      args: this.args.map((a) => ({ term: a.name, description: a.description })),
      options: options.map((o) => ({ term: o.flags, description: o.helpText() })),
      commands,
    }
  }
}

interface HelpItem {
  term: string
  description: string
}

interface HelpModel {
  usage: string
  description: string
  args: HelpItem[]
  options: HelpItem[]
  commands: HelpItem[]
}

/** Below this many columns for the descriptions, they are left unwrapped (too narrow to read wrapped). */
const MIN_WRAP_WIDTH = 40

/** The help as commander lays it out: usage, description, then aligned, wrapped lists. */
function formatHelp(model: HelpModel, width: number): string {
  const termWidth = Math.max(0, ...[...model.args, ...model.options, ...model.commands].map((item) => item.term.length))
  const item = ({ term, description }: HelpItem) => {
    if (!description) return `  ${term}`
    const room = width - termWidth - 4
    const text = room < MIN_WRAP_WIDTH || /\n[^\S\r\n]/.test(description) ? description : wrap(description, room)
    return `  ${term.padEnd(termWidth)}  ${text.replace(/\n/g, `\n${' '.repeat(termWidth + 4)}`)}`
  }
  const out = [`Usage: ${model.usage}`, '']
  if (model.description) out.push(wrap(model.description, width), '')
  for (const [title, items] of [
    ['Arguments:', model.args],
    ['Options:', model.options],
    ['Commands:', model.commands],
  ] as const) {
    if (items.length > 0) out.push(title, ...items.map(item), '')
  }
  return out.join('\n')
}

/** Wraps at whitespace to `width` columns, keeping the line breaks already there. */
function wrap(text: string, width: number): string {
  if (width < MIN_WRAP_WIDTH) return text
  const lines: string[] = []
  for (const raw of text.split(/\r\n|\n/)) {
    const chunks = raw.match(/\s*\S+/g)
    if (chunks === null) {
      lines.push('')
      continue
    }
    let line = chunks.shift() as string
    for (const chunk of chunks) {
      if (line.length + chunk.length <= width) line += chunk
      else {
        lines.push(line)
        line = chunk.trimStart()
      }
    }
    lines.push(line)
  }
  return lines.join('\n')
}

function parseValue(option: Option, value: string, invalid: string): unknown {
  if (!option.parser) return value
  try {
    return option.parser(value)
  } catch (error) {
    if (error instanceof InvalidArgumentError) throw usage(`${invalid} ${error.message}`)
    throw error
  }
}

/** A usage error: printed as `error: <message>` and the line pointing to `--help`, exit code 1. */
function usage(message: string): CliError {
  return new CliError(message, 1, true)
}

function camelCase(flag: string): string {
  return flag.replace(/-(\w)/g, (_, letter: string) => letter.toUpperCase())
}

/** `\n(Did you mean …?)` for a close enough candidate (edit distance, as commander suggests). */
function suggest(word: string, candidates: string[]): string {
  const options = word.startsWith('--')
  const bare = options ? word.slice(2) : word
  let best = 3
  let similar: string[] = []
  for (const candidate of new Set(candidates.map((c) => (options ? c.slice(2) : c)))) {
    if (candidate.length <= 1) continue
    const distance = editDistance(bare, candidate)
    const length = Math.max(bare.length, candidate.length)
    if ((length - distance) / length <= 0.4) continue
    if (distance < best) {
      best = distance
      similar = [candidate]
    } else if (distance === best) similar.push(candidate)
  }
  similar = similar.sort((a, b) => a.localeCompare(b)).map((c) => (options ? `--${c}` : c))
  if (similar.length > 1) return `\n(Did you mean one of ${similar.join(', ')}?)`
  return similar.length === 1 ? `\n(Did you mean ${similar[0]}?)` : ''
}

/** Damerau-Levenshtein distance (optimal string alignment). */
function editDistance(a: string, b: string): number {
  const d: number[][] = Array.from({ length: a.length + 1 }, (_, i) => [i])
  for (let j = 0; j <= b.length; j++) (d[0] as number[])[j] = j
  for (let i = 1; i <= a.length; i++) {
    const row = d[i] as number[]
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1
      row[j] = Math.min(
        ((d[i - 1] as number[])[j] as number) + 1,
        (row[j - 1] as number) + 1,
        ((d[i - 1] as number[])[j - 1] as number) + cost,
      )
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) {
        row[j] = Math.min(row[j] as number, ((d[i - 2] as number[])[j - 2] as number) + 1)
      }
    }
  }
  return (d[a.length] as number[])[b.length] as number
}
