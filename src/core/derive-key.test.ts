import { createHmac, randomUUID } from 'node:crypto'
import fc from 'fast-check'
import { forwardKey, incomingKey } from '../client/forward.js'
import { deriveKey } from './derive-key.js'

describe('deriveKey', () => {
  it('follows the documented construction: dk1_ + base64url(HMAC-SHA256(root, "idemkey/derive-key/v1" NUL step))', () => {
    const expected = `dk1_${createHmac('sha256', 'order-123').update('idemkey/derive-key/v1\0charge').digest('base64url')}`
    expect(deriveKey('order-123', 'charge')).toBe(expected)
    expect(expected).toHaveLength(47)
  })

  it('is deterministic, differs per step and per root, and always makes a valid key', () => {
    const root = fc.stringMatching(/^[\x20-\x7e]{1,255}$/)
    const step = fc.string({ minLength: 1, maxLength: 40 })
    fc.assert(
      fc.property(root, root, step, step, (r1, r2, s1, s2) => {
        expect(deriveKey(r1, s1)).toBe(deriveKey(r1, s1))
        expect(deriveKey(r1, s1)).toMatch(/^dk1_[A-Za-z0-9_-]{43}$/)
        if (s1 !== s2) expect(deriveKey(r1, s1)).not.toBe(deriveKey(r1, s2))
        if (r1 !== r2) expect(deriveKey(r1, s1)).not.toBe(deriveKey(r2, s1))
      }),
    )
  })

  it('refuses an invalid root key and an empty step', () => {
    expect(() => deriveKey('', 'charge')).toThrow(expect.objectContaining({ code: 'KEY_INVALID' }))
    expect(() => deriveKey('root', '')).toThrow(expect.objectContaining({ code: 'INVALID_ARGUMENT' }))
  })
})

describe('forwardKey', () => {
  const root = randomUUID()
  const derived = deriveKey(root, 'charge')

  it('derives the downstream key from a fetch Request, Headers, Node headers or an object with headers', () => {
    expect(forwardKey(new Request('http://x/orders', { method: 'POST', headers: { 'idempotency-key': root } }), 'charge')).toBe(derived)
    expect(forwardKey(new Headers({ 'Idempotency-Key': root }), 'charge')).toBe(derived)
    expect(forwardKey({ 'idempotency-key': root, host: 'x' }, 'charge')).toBe(derived)
    expect(forwardKey({ 'Idempotency-Key': root }, 'charge')).toBe(derived)
    expect(forwardKey({ headers: { 'idempotency-key': [root] } }, 'charge')).toBe(derived)
  })

  it('reads a structured-field string key as its content', () => {
    expect(incomingKey({ 'idempotency-key': `"${root}"` })).toBe(root)
    expect(forwardKey({ 'idempotency-key': `"${root}"` }, 'charge')).toBe(derived)
  })

  it('returns undefined when the incoming request has no key', () => {
    expect(forwardKey(new Headers(), 'charge')).toBeUndefined()
    expect(forwardKey({ host: 'x' }, 'charge')).toBeUndefined()
  })

  it('throws KEY_INVALID for a key given twice or empty', () => {
    expect(() => forwardKey({ 'idempotency-key': ['a', 'b'] }, 'charge')).toThrow(expect.objectContaining({ code: 'KEY_INVALID' }))
    expect(() => forwardKey({ 'idempotency-key': '' }, 'charge')).toThrow(expect.objectContaining({ code: 'KEY_INVALID' }))
  })
})
