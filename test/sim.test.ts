/**
 * The deterministic simulator (sim/, npm run sim; docs/testing.md) must catch each deliberate defect,
 * and a run must replay exactly from its seed. The clean budgeted run is CI's own step (`npm run sim`).
 */
import { runScenario } from '../sim/scenario.js'

describe('the deterministic simulator', () => {
  it('replays a run exactly from its seed: the same schedule, event for event', async () => {
    const a = await runScenario({ seed: 42, trace: true })
    const b = await runScenario({ seed: 42, trace: true })
    expect(a.events).toBeGreaterThan(100)
    expect(b.trace).toEqual(a.trace)
    expect(a.violations).toEqual([])
  })

  it('replays the same runs whether it settles between events on a tick or on a turn of the event loop', async () => {
    // The tick is cheaper but assumes the code under simulation queues no process.nextTick of its own.
    for (const seed of [1, 2, 3, 15, 42]) {
      const onTick = await runScenario({ seed, trace: true })
      const onLoop = await runScenario({ seed, trace: true, settle: 'loop' })
      expect(onTick.trace).toEqual(onLoop.trace)
    }
  })

  // Each defect with the seed the CI-budget search first found it at (npm run sim -- --defect <name>).
  it.each([
    ['fence', 12, /fenced-out holder .* changed the record with complete/],
    ['renew', 298, /ran step \w+ after the store refused its renewal/],
    ['reencode', 1, /answered with 2 different bodies/],
    ['new-key', 1, /reused key with another payload|charged 2 times/],
    ['late-complete', 15, /retried complete \(try \d+\) \d+ms after its lease ended/],
  ] as const)('catches the defect "%s" (seed %i)', async (defect, seed, violation) => {
    const result = await runScenario({ seed, defect })
    expect(result.violations.join('\n')).toMatch(violation)
    // Without the defect the same schedule passes.
    expect((await runScenario({ seed })).violations).toEqual([])
  })
})
