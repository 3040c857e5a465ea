import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { SqliteStore } from '../src/stores/sqlite/index.js'
import { describeLedgerProcesses } from './helpers/ledger-processes.js'

describe('SqliteStore: one file shared by several processes', () => {
  const dir = mkdtempSync(join(tmpdir(), 'idemkey-procs-'))
  const path = join(dir, 'shared.db')
  const store = new SqliteStore({ path })
  afterAll(async () => {
    await store.close()
    rmSync(dir, { recursive: true, force: true })
  })
  describeLedgerProcesses({ url: () => `sqlite:${path}`, store: () => store, race: { processes: 4, keys: 300 } })
})
