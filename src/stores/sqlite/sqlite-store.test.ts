import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { describeStore, describeStoreModel } from '../../testing/index.js'
import { SqliteStore } from './sqlite-store.js'

const dir = mkdtempSync(join(tmpdir(), 'idemkey-sqlite-'))
const teardown = () => rmSync(dir, { recursive: true, force: true })

describeStore('sqlite (file, WAL)', ({ clock }) => new SqliteStore({ path: join(dir, 'contract.db'), clock }))
describeStore('sqlite (:memory:)', ({ clock }) => new SqliteStore({ path: ':memory:', clock }))
describeStoreModel('sqlite (file, WAL)', ({ clock }) => new SqliteStore({ path: join(dir, 'model.db'), clock }), {
  numRuns: 1_000,
  teardown,
})
