/**
 * Keeps Node 22's `ExperimentalWarning` for node:sqlite out of the CLI's own processes (the command and
 * the demo's workers): the embedded store is the CLI's default, so on Node 22 that warning, once per
 * process, was the first thing `idemkey demo` printed, several times over. Every other warning prints as
 * before, and an app that uses the library sees Node's warnings untouched: this runs only in the CLI.
 */
export function quietSqliteWarning(): void {
  const emit = process.emitWarning
  process.emitWarning = function emitWarning(this: NodeJS.Process, warning: string | Error, ...rest: unknown[]): void {
    const first = rest[0]
    const type =
      typeof first === 'string' ? first : typeof warning === 'string' ? (first as { type?: string } | undefined)?.type : warning.name
    const text = typeof warning === 'string' ? warning : warning.message
    if (type === 'ExperimentalWarning' && text.startsWith('SQLite is an experimental feature')) return
    Reflect.apply(emit, this, [warning, ...rest])
  } as typeof process.emitWarning
}
