/**
 * One racer for test/mysql-processes.test.ts: opens its own pool, says "ready", waits for "go" on
 * stdin, then acquires every key at once and prints what it got as one JSON line.
 * Usage: node --import tsx test/mysql-race-worker.ts <uri> <table> <scope> <keys> <offset>
 * Each racer starts at another key (`offset`), so that the first to start cannot sweep them all.
 */
import { createInterface } from 'node:readline'
import { MySqlStore } from '../src/stores/mysql/index.js'
import { fp } from '../src/testing/index.js'

const [uri, table, scope, count, offset] = process.argv.slice(2) as [string, string, string, string, string]
const store = new MySqlStore({ uri, table, connectionLimit: 4 })
// Open the pool's connections before the start signal, so the race is between statements.
await Promise.all(Array.from({ length: 4 }, () => store.get(scope, 'warm-up')))
console.log('ready')
const lines = createInterface({ input: process.stdin })
for await (const line of lines) if (line.trim() === 'go') break
const keys = Array.from({ length: Number(count) }, (_, i) => `key-${(i + Number(offset)) % Number(count)}`)
const results = await Promise.all(keys.map(async (key) => ({ key, result: await store.acquire(scope, key, fp('race'), 60_000) })))
console.log(JSON.stringify({ pid: process.pid, results }))
await store.close()
lines.close()
