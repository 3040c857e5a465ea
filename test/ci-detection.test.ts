import { isCI } from './helpers/services.js'

describe('CI detection (a missing service fails in CI, never skips)', () => {
  it('recognises the values CI systems set', () => {
    for (const value of ['true', 'TRUE', '1', 'yes', 'woodpecker', ' true ']) expect(isCI({ CI: value }), value).toBe(true)
  })

  it('treats an unset, empty or explicitly negative CI as a local run', () => {
    expect(isCI({})).toBe(false)
    for (const value of ['', ' ', 'false', 'False', '0', 'no', 'off']) expect(isCI({ CI: value }), JSON.stringify(value)).toBe(false)
  })
})
