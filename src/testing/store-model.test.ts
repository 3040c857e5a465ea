import { afterEach, describe, expect, it } from 'vitest'
import { modelRuns } from './store-model.js'

describe('the store model run count', () => {
  const saved = process.env.IDEMKEY_MODEL_RUNS
  afterEach(() => {
    if (saved === undefined) delete process.env.IDEMKEY_MODEL_RUNS
    else process.env.IDEMKEY_MODEL_RUNS = saved
  })

  it('runs the suite its numRuns, 1,000 by default, with IDEMKEY_MODEL_RUNS unset', () => {
    delete process.env.IDEMKEY_MODEL_RUNS
    expect(modelRuns(undefined)).toBe(1_000)
    expect(modelRuns(300)).toBe(300)
  })

  it('caps numRuns at IDEMKEY_MODEL_RUNS, never raises it', () => {
    process.env.IDEMKEY_MODEL_RUNS = '50'
    expect(modelRuns(undefined)).toBe(50)
    expect(modelRuns(300)).toBe(50)
    expect(modelRuns(20)).toBe(20)
  })

  it('ignores an IDEMKEY_MODEL_RUNS that is not a positive whole number', () => {
    for (const value of ['', '0', '-5', '2.5', 'many']) {
      process.env.IDEMKEY_MODEL_RUNS = value
      expect(modelRuns(300)).toBe(300)
    }
  })
})
