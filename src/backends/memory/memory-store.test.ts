import { describeStore, describeStoreModel } from '../../testing/index.js'
import { MemoryStore } from './memory-store.js'

describeStore('memory', ({ clock }) => new MemoryStore({ clock }))
describeStoreModel('memory', ({ clock }) => new MemoryStore({ clock }), { numRuns: 1_000 })
