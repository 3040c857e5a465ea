export { MemoryStore, type MemoryStoreOptions } from './memory-store.js'
