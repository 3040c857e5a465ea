/** The subset of a better-sqlite3 `Database` the SQLite outbox and inbox use (structural, no import). */
export interface SqliteStatement {
  run(...params: unknown[]): { changes: number }
  get(...params: unknown[]): unknown
  all(...params: unknown[]): unknown[]
}

type ArgumentTypes<F> = F extends (...args: infer A) => unknown ? A : never

export interface SqliteDb {
  prepare(sql: string): SqliteStatement
  exec(sql: string): unknown
  // biome-ignore lint/suspicious/noExplicitAny: the same constraint as better-sqlite3's own signature
  transaction<F extends (...args: any[]) => unknown>(fn: F): { immediate(...args: ArgumentTypes<F>): ReturnType<F> }
  readonly inTransaction: boolean
}
