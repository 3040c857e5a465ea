import { quietSqliteWarning } from './quiet-warnings.js'

describe("quietSqliteWarning: the CLI without node:sqlite's ExperimentalWarning", () => {
  const original = process.emitWarning
  afterEach(() => {
    process.emitWarning = original
  })

  async function emitted(emit: () => void): Promise<string[]> {
    const seen: string[] = []
    const listener = (warning: Error) => seen.push(`${warning.name}: ${warning.message}`)
    process.on('warning', listener)
    try {
      emit()
      // Node emits 'warning' on the next tick.
      await new Promise((resolve) => setImmediate(resolve))
    } finally {
      process.removeListener('warning', listener)
    }
    return seen
  }

  it('drops only the SQLite ExperimentalWarning, in each form emitWarning takes', async () => {
    quietSqliteWarning()
    const sqlite = 'SQLite is an experimental feature and might change at any time'
    expect(await emitted(() => process.emitWarning(sqlite, 'ExperimentalWarning'))).toEqual([])
    expect(await emitted(() => process.emitWarning(sqlite, { type: 'ExperimentalWarning' }))).toEqual([])
    const other = await emitted(() => {
      process.emitWarning('Fetch is an experimental feature', 'ExperimentalWarning')
      process.emitWarning(sqlite, 'Warning')
      process.emitWarning('something else', { type: 'DeprecationWarning', code: 'DEP0' })
    })
    expect(other).toEqual([
      'ExperimentalWarning: Fetch is an experimental feature',
      `Warning: ${sqlite}`,
      'DeprecationWarning: something else',
    ])
  })
})
