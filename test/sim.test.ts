/**
 * The deterministic simulator (sim/, npm run sim; docs/testing.md) must catch each deliberate defect,
 * and a run must replay exactly from its seed. The clean budgeted run is CI's own step (`npm run sim`).
 */
import { runScenario } from '../sim/scenario.js'
import { World } from '../sim/world.js'

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

  it('lets time pass to the bound when no event is left before it, as leases and deadlines do', async () => {
    const world = new World(1)
    world.at(100, null, () => {})
    await world.run(() => false, 5_000)
    expect(world.now).toBe(5_000)
    world.at(10_000, null, () => {})
    await world.run(() => false, 8_000)
    expect(world.now).toBe(8_000)
    await world.run(() => false)
    expect(world.now).toBe(15_000) // the event, scheduled at 5,000 for 10,000 later; no bound, no time past it
  })

  it('checks held records only once every lease has had its time to run out (seed 70048219)', async () => {
    // A soak found this seed "still in progress past its holders": a holder cut off from the store took a
    // record 1.6 s before the last event, and the run stopped there, short of the 8 s it meant to wait.
    // The workload of issue 57 (chosen keys, slow holders) changed this seed's schedule: it now pins that the
    // seed passes, no longer the 50 s of simulated time the old schedule reached.
    const result = await runScenario({ seed: 70048219 })
    expect(result.violations).toEqual([])
  })

  // Each defect with the seed the CI-budget search first found it at (npm run sim -- --defect <name>).
  it.each([
    ['fence', 25, /fenced-out holder .* changed the record with complete/],
    [
      'renew',
      8,
      /first read its signal after the store refused its renewal|ran step \w+ after the store refused its renewal|ran step \w+ to its end, \d+ms after its lease ended in the store, and its signal is not aborted/,
    ],
    ['reencode', 1, /answered with 2 different bodies/],
    ['new-key', 1, /reused key with another payload|charged 2 times/],
    ['late-complete', 29, /retried complete \(try \d+\) \d+ms (after its lease ended|past its run deadline)/],
    // A survivor of npm run mutate:sim (renewal.ts, fire() emptied): slow live holders lost their lease unseen.
    [
      'no-renew',
      1,
      /lost its record while alive and working: it never asked to renew its lease|(started step \w+|ran step \w+ to its end), \d+ms after its lease ended in the store, and its signal is not aborted/,
    ],
    // The store's own promises (sim/store-defects.ts): each passed every seed of the CI budget before the
    // simulator audited takeovers, scopes and whose answer a caller gets (issue 57).
    ['early-takeover', 1, /took over from .* before its lease ended in the store/],
    ['scope-blind', 1, /refused as a key reused with another request, though it was only ever sent with this one/],
    ['foreign-replay', 1, /got another intent's answer|answered 201 to a reused key with another payload/],
    // Survivors of npm run mutate:sim (renewal.ts's catch, current kept true; steps.ts's captures): renewals that
    // failed for a whole lease never lost it, and a takeover captured its values anew; both passed every seed
    // before the workload refused renewals for a while and captured values (issue 57).
    [
      'renew-errors',
      1,
      /a failed store call \(renew .*\) was reported nowhere|(started step \w+|ran step \w+ to its end), \d+ms after its lease ended in the store, and its signal is not aborted/,
    ],
    ['fresh-capture', 1, /captured values .* are not those the charge recorded/],
    // Survivors of npm run mutate:sim in held.ts and renewal.ts: a transient answer stored as the outcome, a run
    // handed to the engine whose telemetry never ends, a lost lease not reported; each passed every seed before
    // the simulator audited what the ledger reports and the handler answered 503 itself (issue 57).
    ['transient-stored', 1, /stored its 503 answer as the outcome/],
    ['untold-end', 1, /a run of .* never ended/],
    ['lost-unreported', 3, /was refused its renewal while working and no lease_lost was reported/],
    // Survivors of npm run mutate:sim in held.ts (the value that cannot be recorded, the guard against a second
    // settle): each passed every seed before a consumer drove ledger.begin itself with values JSON cannot hold
    // and an ack timeout of its own (issue 57).
    ['unstorable-released', 1, /released its record after handing finish\(\) its final value/],
    [
      'settle-twice',
      1,
      /released its record after handing finish\(\) its final value|called fail\(\) while finish\(\) was under way, and it was not refused/,
    ],
    // Classes npm run mutate:sim showed unseen (ledger.ts's transactions, the `stored` event's emission): each
    // passed every seed before the keys that end in 5 ran in a store transaction and every outcome the ledger
    // learnt of had to be reported (issue 57).
    ['tx-steps-outside', 1, /recorded step \S+ outside its transaction/],
    ['stored-unreported', 1, /learnt its outcome was stored, and no stored was reported/],
    // A survivor of npm run mutate:sim in ledger.ts (a transactional rollback taken for a fence): no invariant
    // asked that a fenced_out be one the store gave (issue 57).
    ['phantom-fence', 1, /was reported fenced_out, and the store refused none of its outcomes/],
    // A survivor of npm run mutate:sim in store-calls.ts (release's body emptied): a record kept to the end of its
    // lease only slows the retries, which no invariant bounded (issue 57).
    ['unreleased', 1, /failed transiently and its process never asked the store to release the record/],
    // A survivor class of npm run mutate:sim in the memory store (its watch and notifications): the simulated
    // stores had no watch, so waiting requests only polled, until the network store subscribed (issue 57).
    ['no-notify', 1, /did not notify its watcher on/],
    // Survivors of npm run mutate:sim in the memory store's operator commands (list, evict, the attempts count):
    // the fleet never listed nor evicted, until an operator did beside it (issue 57).
    ['evict-lingers', 1, /is still read after its evict/],
    // The callers that get the API wrong and the store's exact edges (sim/misuse.ts): the 131 argument and option
    // checks, the wait's polls, the Retry-After arithmetic and the one-tick edges of the memory store were the bulk
    // of what npm run mutate:sim missed; each of these passed every seed before those cases (issue 57).
    ['lease-edge', 4, /misuse: the store, (\d+ms into a \d+ms (lease|retention)|at the end of)/],
    ['retry-hint', 1, /misuse: a duplicate of a held .* is \["in_progress",\d+,\d+\], expected/],
    ['overwait', 1, /misuse: a duplicate of a held .*: its sleeps is/],
    ['vague-errors', 1, /misuse: .* was refused without naming/],
    ['all-unavailable', 2, /misuse: a run on a store whose complete fails .*\(schema/],
    // The last survivors of ledger.ts (395/396): a transactional run's transient failure, which the fleet only meets
    // through the engine, whose 503 looks the same either way.
    ['transient-thrown', 12, /misuse: runInTransaction, its value transient, .* was refused: threw the transaction was rolled back/],
  ] as const)('catches the defect "%s" (seed %i)', async (defect, seed, violation) => {
    const result = await runScenario({ seed, defect })
    expect(result.violations.join('\n')).toMatch(violation)
    // Without the defect the same schedule passes.
    expect((await runScenario({ seed })).violations).toEqual([])
  })
})
