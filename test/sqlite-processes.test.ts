import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { describeLedgerProcesses } from './helpers/ledger-processes.js'
import { SQLITE_DRIVERS, sqliteUrl, storeOn } from './helpers/sqlite-drivers.js'

describe.each(SQLITE_DRIVERS)('SqliteStore on %s: one file shared by several processes', (driver) => {
  const dir = mkdtempSync(join(tmpdir(), 'idemkey-procs-'))
  const path = join(dir, 'shared.db')
  const store = storeOn(driver, { path })
  afterAll(async () => {
    await store.close()
    rmSync(dir, { recursive: true, force: true })
  })
  describeLedgerProcesses({ url: () => sqliteUrl(driver, path), store: () => store, race: { processes: 4, keys: 300 } })
})
