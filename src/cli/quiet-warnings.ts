/**
 * Keeps Node 22's `ExperimentalWarning` for node:sqlite out of the CLI's own processes (the command and
 * the demo's workers): the embedded store is the CLI's default, so on Node 22 that warning, once per
 * process, was the first thing `idemkey demo` printed, several times over. Every other warning prints as
 * before, and an app that uses the library sees Node's warnings untouched: this runs only in the CLI.
 */
export function quietSqliteWarning(): void {
  const emit = process.emitWarning
  process.emitWarning = function emitWarning(this: NodeJS.Process, warning: string | Error, ...rest: unknown[]): void {
    // emitWarning(text, type) or emitWarning(text, { type }); an Error carries its type as its name.
    const [first] = rest
    const type =
      typeof warning !== 'string' ? warning.name : typeof first === 'string' ? first : (first as { type?: string } | undefined)?.type
    const text = typeof warning === 'string' ? warning : warning.message
    if (type === 'ExperimentalWarning' && text.startsWith('SQLite is an experimental feature')) return
    Reflect.apply(emit, this, [warning, ...rest])
  } as typeof process.emitWarning
}
