import { MemoryStore } from '../../src/backends/memory/memory-store.js'

/** A MemoryStore that counts acquisitions, to see whether a request touched the ledger. */
export function countingStore(): MemoryStore & { acquired: number } {
  const store = Object.assign(new MemoryStore(), { acquired: 0 })
  const acquire = store.acquire.bind(store)
  store.acquire = (...args) => {
    store.acquired++
    return acquire(...args)
  }
  return store
}
