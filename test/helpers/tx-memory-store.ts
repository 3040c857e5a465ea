import type { Outcome, TransactionalStore } from '../../src/core/store.js'
import { MemoryStore } from '../../src/stores/memory/memory-store.js'

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
  completeInTransaction(_tx: string[], scope: string, key: string, token: number, outcome: Outcome, ttlMs: number): Promise<boolean> {
    return this.complete(scope, key, token, outcome, ttlMs)
  }
}
