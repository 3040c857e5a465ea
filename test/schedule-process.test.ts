/**
 * The schedule on the system clock in a process of its own (the unit tests are src/core/schedule.test.ts):
 * an entry due a minute away must not keep an otherwise idle process alive.
 */
import { runNode } from './helpers/cli.js'

describe('Schedule on the system clock, in a child process', () => {
  it('never keeps an idle process alive: a process with an entry a minute away exits at once', async () => {
    const started = Date.now()
    const script = `
      const { Schedule } = await import(${JSON.stringify(new URL('../src/core/schedule.ts', import.meta.url).href)})
      const { systemClock } = await import(${JSON.stringify(new URL('../src/core/clock.ts', import.meta.url).href)})
      const schedule = new Schedule(systemClock)
      const removed = { dueAtMs: 0, fire() { process.exitCode = 3 } }
      schedule.add(removed, 60_000)
      schedule.remove(removed, 60_000)
      schedule.add({ dueAtMs: 0, fire() { process.exitCode = 4 } }, 60_000)
    `
    // Awaited, not spawnSync: a worker blocked on a child cannot answer vitest's RPC (docs/testing.md).
    const run = await runNode(['--import', 'tsx', '--input-type=module', '-e', script])
    expect(run.stderr).toBe('')
    expect(run.code).toBe(0)
    expect(Date.now() - started).toBeLessThan(30_000)
  })
})
