import { MemoryStore } from '../../src/backends/memory/memory-store.js'
import type { Outcome, SavepointCommand, TransactionalStore } from '../../src/core/store.js'

/**
 * A transactional store for the ledger's logic: writes made on `tx` become visible only on commit.
 * (The real thing, PostgreSQL and MySQL, is tested against the server in its own suite.)
 */
export class TxMemoryStore extends MemoryStore implements TransactionalStore<string[]> {
  readonly committed: string[] = []
  async transaction<R>(fn: (tx: string[]) => Promise<R>): Promise<R> {
    const tx: string[] = []
    const result = await fn(tx)
    this.committed.push(...tx)
    return result
  }
  readonly #savepoints = new WeakMap<string[], number>()
  /** A savepoint is the number of writes made on `tx` so far; rolling back to it drops the later ones. */
  async savepointInTransaction(tx: string[], command: SavepointCommand): Promise<void> {
    if (command === 'set') this.#savepoints.set(tx, tx.length)
    else tx.length = this.#savepoints.get(tx) ?? 0
  }
  completeInTransaction(_tx: string[], scope: string, key: string, token: number, outcome: Outcome, ttlMs: number): Promise<boolean> {
    return this.complete(scope, key, token, outcome, ttlMs)
  }
}
