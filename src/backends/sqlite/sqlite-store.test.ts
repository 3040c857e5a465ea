import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { SQLITE_DRIVERS, storeOn } from '../../../test/helpers/sqlite-drivers.js'
import { describeStore, describeStoreModel } from '../../testing/index.js'

const dir = mkdtempSync(join(tmpdir(), 'idemkey-sqlite-'))
afterAll(() => rmSync(dir, { recursive: true, force: true }))

// The whole contract and the model, once per driver: node:sqlite (the default) and better-sqlite3.
for (const driver of SQLITE_DRIVERS) {
  describeStore(`sqlite on ${driver} (file, WAL)`, ({ clock }) => storeOn(driver, { path: join(dir, `contract-${driver}.db`), clock }))
  describeStore(`sqlite on ${driver} (:memory:)`, ({ clock }) => storeOn(driver, { path: ':memory:', clock }))
  describeStoreModel(`sqlite on ${driver} (file, WAL)`, ({ clock }) => storeOn(driver, { path: join(dir, `model-${driver}.db`), clock }), {
    numRuns: 1_000,
  })
}
