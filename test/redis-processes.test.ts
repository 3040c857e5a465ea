import { randomUUID } from 'node:crypto'
import { Redis } from 'ioredis'
import { raceProcesses } from './fixtures/redis/racers.js'
import { expectRaced } from './helpers/race-rounds.js'
import { serviceSkipReason } from './helpers/services.js'

const URL = 'redis://127.0.0.1:6379'
const skip = await serviceSkipReason('Redis', 6379)
const PROCESSES = 4
const KEYS = 300

describe.skipIf(skip !== undefined)('RedisStore across processes', () => {
  it(`runs each of ${KEYS} keys exactly once when ${PROCESSES} processes run them all at once, and the others replay`, async () => {
    await expectRaced(raceRound)
  })
})

/** One race of every process over the same keys; returns how many processes executed some of them. */
async function raceRound(): Promise<number> {
  const prefix = `idemkey-test-${randomUUID()}`
  const counter = `${prefix}:executions`
  const reports = await raceProcesses({ mode: 'single', target: URL, prefix, scope: 'procs', keys: KEYS, processes: PROCESSES, counter })
  const redis = new Redis(URL)
  try {
    const executions = await redis.hgetall(counter)
    expect(Object.keys(executions)).toHaveLength(KEYS)
    for (const [key, times] of Object.entries(executions)) expect(times, key).toBe('1')
    const total = (kind: string) => reports.reduce((sum, r) => sum + (r.seen[kind] ?? 0), 0)
    expect(total('executed:completed')).toBe(KEYS)
    expect(total('replayed')).toBe(KEYS * (PROCESSES - 1))
    return reports.filter((r) => (r.seen['executed:completed'] ?? 0) > 0).length
  } finally {
    const keys = await redis.keys(`${prefix}:*`)
    if (keys.length > 0) await redis.del(...keys)
    redis.disconnect()
  }
}
