import { deriveKey } from '../../core/derive-key.js'
import type { Publisher } from '../message.js'
import { OutboxRelay } from './relay.js'
import { encodeEvent, messageIdFor, type RelayStorage } from './storage.js'

describe('outbox message IDs', () => {
  it('derives the ID from the request key, topic and n, so a replay gets the same ID', () => {
    const a = messageIdFor({ topic: 'orders.created', idempotencyKey: 'req-1' })
    expect(a).toBe(deriveKey('req-1', 'outbox:orders.created:0'))
    expect(messageIdFor({ topic: 'orders.created', idempotencyKey: 'req-1' })).toBe(a)
    expect(messageIdFor({ topic: 'orders.created', idempotencyKey: 'req-1', n: 1 })).not.toBe(a)
    expect(messageIdFor({ topic: 'orders.paid', idempotencyKey: 'req-1' })).not.toBe(a)
  })

  it('uses an explicit id over the request key, and a fresh UUID when there is neither', () => {
    expect(messageIdFor({ topic: 't', id: 'evt-1', idempotencyKey: 'req-1' })).toBe('evt-1')
    const one = messageIdFor({ topic: 't' })
    expect(one).toMatch(/^[0-9a-f-]{36}$/)
    expect(messageIdFor({ topic: 't' })).not.toBe(one)
  })

  it('refuses an empty id, a negative n and a bad request key', () => {
    expect(() => messageIdFor({ topic: 't', id: '' })).toThrow(expect.objectContaining({ code: 'INVALID_ARGUMENT' }))
    expect(() => messageIdFor({ topic: 't', idempotencyKey: 'k', n: -1 })).toThrow(expect.objectContaining({ code: 'INVALID_ARGUMENT' }))
    expect(() => messageIdFor({ topic: 't', idempotencyKey: 'bad\nkey' })).toThrow(expect.objectContaining({ code: 'KEY_INVALID' }))
  })
})

describe('outbox event encoding', () => {
  it('writes JSON as UTF-8 and bytes as they are', () => {
    expect(encodeEvent({ topic: 't', payload: { a: 'é' } }, 100)).toMatchObject({
      contentType: 'application/json',
      payload: Buffer.from('{"a":"é"}'),
    })
    expect(encodeEvent({ topic: 't', payload: new Uint8Array([1, 2]) }, 100)).toMatchObject({
      contentType: 'application/octet-stream',
      payload: Buffer.from([1, 2]),
    })
  })

  it('counts the size limit in bytes, not characters', () => {
    expect(() => encodeEvent({ topic: 't', payload: 'é'.repeat(5) }, 11)).toThrow(expect.objectContaining({ code: 'BODY_TOO_LARGE' }))
    expect(encodeEvent({ topic: 't', payload: 'é'.repeat(5) }, 12).payload.byteLength).toBe(12)
  })

  it('refuses a missing topic, non-string headers and an empty partition key', () => {
    expect(() => encodeEvent({ topic: '', payload: 1 }, 100)).toThrow(expect.objectContaining({ code: 'INVALID_ARGUMENT' }))
    expect(() => encodeEvent({ topic: 't', payload: 1, headers: { n: 1 as unknown as string } }, 100)).toThrow(
      expect.objectContaining({ code: 'INVALID_ARGUMENT' }),
    )
    expect(() => encodeEvent({ topic: 't', payload: 1, partitionKey: '' }, 100)).toThrow(
      expect.objectContaining({ code: 'INVALID_ARGUMENT' }),
    )
  })
})

describe('OutboxRelay options', () => {
  const storage = {} as RelayStorage
  const publisher: Publisher = { name: 'p', publish: async () => [] }
  it('refuses a zero batch size, zero attempts, zero concurrency, an unreadable lease, and what would spin or fail later (a lease, poll interval or first backoff of 0, a publisher without publish(), an onEvent that is no function)', () => {
    expect(() => new OutboxRelay({ outbox: storage, publisher })).not.toThrow()
    const refusals: Array<[Record<string, unknown>, string]> = [
      [{ batchSize: 0 }, 'batchSize must be a positive integer'],
      [{ maxAttempts: 0 }, 'maxAttempts must be a positive integer'],
      [{ concurrency: 0 }, 'concurrency must be a positive integer'],
      [{ lease: 'soon' }, 'lease "soon" is not a duration'],
      // A claim with a lease of 0 leaves the row to every other relay at once; a poll interval of 0 is a busy loop.
      [{ lease: 0 }, 'lease must be longer than 0'],
      [{ pollInterval: '0s' }, 'pollInterval must be longer than 0'],
      [{ backoffInitial: 0 }, 'backoffInitial must be longer than 0'],
      [{ publisher: { name: 'p' } }, 'OutboxRelay: publisher must be an object with publish()'],
      [{ onEvent: 'console' }, 'OutboxRelay: onEvent must be a function'],
    ]
    for (const [bad, message] of refusals) {
      expect(() => new OutboxRelay({ outbox: storage, publisher, ...bad } as never), message).toThrow(
        expect.objectContaining({ code: 'INVALID_OPTION', message: expect.stringContaining(message) }),
      )
    }
  })
})
