import type { Fault } from './fault-injector.js'

/** How often each fault hits an intent (fractions from 0 to 1; their sum must stay at or below 1). */
export interface FaultRates {
  drop: number
  timeout: number
  crash: number
  double: number
  reuse: number
}

/** One intent the demo's clients mean to happen once. */
export interface PlannedIntent {
  id: string
  amount: number
  fault: Fault
}

/** A small seeded generator (mulberry32), so both APIs get exactly the same traffic. */
export function seededRandom(seed: number): () => number {
  let state = seed >>> 0
  return () => {
    state = (state + 0x6d2b79f5) >>> 0
    let t = state
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
}

/**
 * The demo's traffic: `count` intents, each with an amount and at most one fault, drawn from `seed`.
 *
 * @example planIntents(300, { drop: 0.08, timeout: 0.04, crash: 0.02, double: 0.05, reuse: 0.03 }, 1)
 */
export function planIntents(count: number, rates: FaultRates, seed: number): PlannedIntent[] {
  const random = seededRandom(seed)
  const order: Array<[Fault, number]> = [
    ['drop', rates.drop],
    ['timeout', rates.timeout],
    ['crash', rates.crash],
    ['double', rates.double],
    ['reuse', rates.reuse],
  ]
  const intents: PlannedIntent[] = []
  for (let i = 0; i < count; i++) {
    const roll = random()
    let fault: Fault = 'none'
    let edge = 0
    for (const [kind, rate] of order) {
      edge += rate
      if (roll < edge) {
        fault = kind
        break
      }
    }
    intents.push({ id: `intent-${String(i + 1).padStart(5, '0')}`, amount: 100 + Math.floor(random() * 9900), fault })
  }
  return intents
}
