import type { TransactionalStore } from '../../src/core/store.js'

/** The same store, except that its renewals never reach the server: a holder paused (GC, partition) past its lease. */
export function paused<Tx>(store: TransactionalStore<Tx>): TransactionalStore<Tx> {
  return {
    name: store.name,
    serverClock: true,
    acquire: (...args) => store.acquire(...args),
    renew: async () => true,
    complete: (...args) => store.complete(...args),
    release: (...args) => store.release(...args),
    get: (...args) => store.get(...args),
    list: (...args) => store.list(...args),
    purgeExpired: (...args) => store.purgeExpired(...args),
    evict: (...args) => store.evict(...args),
    close: async () => {},
    transaction: (fn) => store.transaction(fn),
    completeInTransaction: (...args) => store.completeInTransaction(...args),
    savepointInTransaction: store.savepointInTransaction && ((...args) => store.savepointInTransaction?.(...args) as Promise<void>),
  }
}
