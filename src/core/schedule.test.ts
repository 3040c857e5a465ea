import { ManualClock, systemClock } from './clock.js'
import { Schedule, type Scheduled } from './schedule.js'

function entry(name: string, fired: string[], onFire?: () => void): Scheduled {
  return {
    dueAtMs: 0,
    fire: () => {
      fired.push(name)
      onFire?.()
    },
  }
}

describe('Schedule', () => {
  it('fires each entry once, a delay after it was added, in the order they came due', () => {
    const clock = new ManualClock()
    const schedule = new Schedule(clock)
    const fired: string[] = []
    schedule.add(entry('a', fired), 100)
    clock.advance(30)
    schedule.add(entry('b', fired), 100)
    schedule.add(entry('fast', fired), 10)
    clock.advance(10)
    expect(fired).toEqual(['fast'])
    clock.advance(60)
    expect(fired).toEqual(['fast', 'a'])
    clock.advance(29)
    expect(fired).toEqual(['fast', 'a'])
    clock.advance(1)
    expect(fired).toEqual(['fast', 'a', 'b'])
    clock.advance(1_000)
    expect(fired).toEqual(['fast', 'a', 'b'])
  })

  it('keeps one clock timer per delay, and none once its entries are gone, so an idle process can exit', () => {
    const clock = new ManualClock()
    const schedule = new Schedule(clock)
    const fired: string[] = []
    const entries = Array.from({ length: 50 }, (_, i) => entry(`e${i}`, fired))
    for (const e of entries) schedule.add(e, 1_000)
    expect(clock.pendingSleeps).toBe(1)
    for (const e of entries) schedule.remove(e, 1_000)
    expect(clock.pendingSleeps).toBe(0)
    clock.advance(5_000)
    expect(fired).toEqual([])
  })

  it('does not fire an entry removed before it was due, and leaves the others due', () => {
    const clock = new ManualClock()
    const schedule = new Schedule(clock)
    const fired: string[] = []
    const a = entry('a', fired)
    schedule.add(a, 100)
    schedule.add(entry('b', fired), 100)
    schedule.remove(a, 100)
    clock.advance(100)
    expect(fired).toEqual(['b'])
    expect(clock.pendingSleeps).toBe(0)
  })

  it('an entry added again while firing is due a whole delay later, with a single timer for it', () => {
    const clock = new ManualClock()
    const schedule = new Schedule(clock)
    const fired: string[] = []
    const again: Scheduled = entry('again', fired, () => schedule.add(again, 100))
    schedule.add(again, 100)
    clock.advance(100)
    expect(fired).toEqual(['again'])
    expect(clock.pendingSleeps).toBe(1)
    clock.advance(99)
    expect(fired).toEqual(['again'])
    clock.advance(1)
    expect(fired).toEqual(['again', 'again'])
  })

  it('an entry that throws does not keep the later ones from firing', () => {
    const clock = new ManualClock()
    const schedule = new Schedule(clock)
    const fired: string[] = []
    schedule.add(
      entry('bad', fired, () => {
        throw new Error('boom')
      }),
      10,
    )
    schedule.add(entry('good', fired), 10)
    clock.advance(10)
    expect(fired).toEqual(['bad', 'good'])
  })
})

describe('Schedule on the system clock', () => {
  it('fires an entry on time although its timer was left armed by an earlier entry', async () => {
    const schedule = new Schedule(systemClock)
    const fired: string[] = []
    const early = entry('early', fired)
    schedule.add(early, 40)
    schedule.remove(early, 40)
    await new Promise((resolve) => setTimeout(resolve, 20))
    schedule.add(entry('late', fired), 40)
    await new Promise((resolve) => setTimeout(resolve, 30))
    expect(fired).toEqual([])
    await new Promise((resolve) => setTimeout(resolve, 60))
    expect(fired).toEqual(['late'])
  })
})
