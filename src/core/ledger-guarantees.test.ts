/**
 * Tests written where mutation testing (npm run mutate, docs/testing.md) found rules of the ledger and
 * the fingerprint that no test pinned: each fails when the rule it names is broken.
 */
import { createHash, randomUUID } from 'node:crypto'
import { TxMemoryStore } from '../../test/helpers/tx-memory-store.js'
import { MemoryStore } from '../backends/memory/memory-store.js'
import { IdempotencyError } from '../errors.js'
import { ManualClock } from './clock.js'
import { fingerprintOf, sha256Hex } from './fingerprint.js'
import { Ledger, type LedgerEvent } from './ledger.js'

const key = () => `k-${randomUUID()}`
const sha256 = (...parts: Array<string | Uint8Array>) => {
  const hash = createHash('sha256')
  for (const part of parts) hash.update(part)
  return hash.digest('hex')
}

describe('fingerprints of bytes', () => {
  it('hashes a payload of bytes as those bytes, not as the JSON of a typed array', () => {
    const bytes = Uint8Array.of(0x7b, 0x7d, 0xff, 0x00)
    expect(fingerprintOf(bytes)).toBe(sha256(bytes))
    expect(fingerprintOf(bytes)).not.toBe(fingerprintOf(Array.from(bytes)))
  })

  it('hashes parts of text and bytes as their concatenation, every byte as it is', () => {
    const body = Uint8Array.of(0xc3, 0x28, 0xff)
    expect(sha256Hex('POST /charges\n', 'bytes\n', body)).toBe(sha256('POST /charges\nbytes\n', body))
    expect(sha256Hex('a', 'b')).toBe(sha256('ab'))
    expect(sha256Hex(body)).toBe(sha256(body))
    // Not the text "195,40,255" that joining the parts as strings would hash.
    expect(sha256Hex('x', body)).not.toBe(sha256(`x${String(body)}`))
  })
})

describe('Ledger: what the work is told, and outcomes a store cannot record', () => {
  function setup() {
    const clock = new ManualClock()
    const store = new MemoryStore({ clock })
    const events: LedgerEvent[] = []
    const ledger = new Ledger({ store, clock, lease: '30s', ttl: '1h', wait: 0, onEvent: (e) => events.push(e) })
    return { clock, store, ledger, events }
  }

  it('tells the first attempt it is no takeover, and the attempt after a lease ended that it is one', async () => {
    const { clock, store, ledger } = setup()
    const k = key()
    const first = await ledger.run({ key: k, payload: 1 }, ({ takeover, token }) => ({ takeover, token }))
    expect(first).toMatchObject({ kind: 'executed', value: { takeover: false, token: 1 } })
    const other = key()
    await store.acquire('default', other, fingerprintOf(1), 1_000)
    clock.advance(1_001)
    const taken = await ledger.run({ key: other, payload: 1 }, ({ takeover, token }) => ({ takeover, token }))
    expect(taken).toMatchObject({ kind: 'executed', value: { takeover: true, token: 2 } })
  })

  it('gives up at once on a completion the store refuses for another reason than being unreachable (no retries)', async () => {
    const { store, ledger, events } = setup()
    let calls = 0
    store.complete = async () => {
      calls++
      throw new IdempotencyError('STORE_SCHEMA', 'memory: the table has no response_body column; run migrate()')
    }
    const k = key()
    const result = await ledger.run({ key: k, payload: 1 }, () => 'ran')
    expect(result).toMatchObject({ kind: 'executed', value: 'ran', outcome: 'unrecorded' })
    expect(calls).toBe(1)
    expect(events.find((e) => e.type === 'unrecorded')).toMatchObject({ key: k, token: 1, attempts: 1 })
    expect(events.find((e) => e.type === 'store_error')).toMatchObject({ key: k, operation: 'complete' })
  })

  it('keeps the record of work whose value cannot be encoded held until its lease ends, reported unrecorded, never released to run again', async () => {
    const { clock, store, ledger, events } = setup()
    const k = key()
    let runs = 0
    // A BigInt: JSON.stringify throws, after the work (a charge, say) has run.
    const work = () => {
      runs++
      return { id: 10n }
    }
    const error = await ledger.run({ key: k, payload: 1 }, work).catch((e: unknown) => e)
    expect(error).toBeInstanceOf(IdempotencyError)
    expect(error).toMatchObject({
      code: 'INVALID_ARGUMENT',
      message: expect.stringMatching(/ran, but its value could not be recorded.*BigInt/),
    })
    expect((error as Error).cause).toBeInstanceOf(TypeError)
    expect(events.find((e) => e.type === 'unrecorded')).toMatchObject({ key: k, token: 1, attempts: 0 })
    // A retry within the lease finds the work in progress, not a released record to run again.
    expect(await ledger.run({ key: k, payload: 1 }, work)).toMatchObject({ kind: 'in_progress' })
    expect(runs).toBe(1)
    expect(await store.get('default', k)).toMatchObject({ status: 'in_progress', token: 1 })
    // No renewal keeps it: once the lease has ended, the record can be taken over.
    clock.advance(30_001)
    expect(await store.acquire('default', k, fingerprintOf(1), 1_000)).toMatchObject({ kind: 'acquired', token: 2 })
  })

  it('reports each way a run ends as an event naming the key, with how long it took by the ledger clock', async () => {
    const { clock, ledger, events } = setup()
    const k = key()
    await ledger.run({ key: k, payload: 1 }, async () => {
      clock.advance(7)
      return 'ran'
    })
    await ledger.run({ key: k, payload: 1 }, () => 'again')
    await ledger.run({ key: k, payload: 2 }, () => 'other')
    expect(events.find((e) => e.type === 'stored')).toMatchObject({ type: 'stored', key: k, token: 1, status: 'completed', durationMs: 7 })
    expect(events.find((e) => e.type === 'replayed')).toMatchObject({ type: 'replayed', key: k, durationMs: 0 })
    expect(events.find((e) => e.type === 'mismatch')).toMatchObject({ type: 'mismatch', key: k })
  })
})

describe('Ledger.runInTransaction on a transactional store', () => {
  it('stores the resource id with the outcome, and replays', async () => {
    const store = new TxMemoryStore()
    const ledger = new Ledger({ store })
    const k = key()
    const first = await ledger.runInTransaction(
      { key: k, payload: 1 },
      ({ tx }) => {
        tx.push('order 1')
        return { id: 'ord_1' }
      },
      { resourceId: (v) => v.id },
    )
    expect(first).toMatchObject({ kind: 'executed', outcome: 'completed', value: { id: 'ord_1' } })
    expect((await store.get('default', k))?.resourceId).toBe('ord_1')
    expect(store.committed).toEqual(['order 1'])
    expect(await ledger.runInTransaction({ key: k, payload: 1 }, () => ({ id: 'again' }))).toMatchObject({
      kind: 'replayed',
      value: { id: 'ord_1' },
    })
  })

  it('rethrows what the work threw and releases the key, so the retry runs with the next token', async () => {
    const store = new TxMemoryStore()
    const ledger = new Ledger({ store })
    const k = key()
    const thrown = new Error('card declined by a flaky gateway')
    await expect(ledger.runInTransaction({ key: k, payload: 1 }, () => Promise.reject(thrown))).rejects.toBe(thrown)
    const retry = await ledger.runInTransaction({ key: k, payload: 1 }, ({ token }) => token)
    expect(retry).toMatchObject({ kind: 'executed', outcome: 'completed', value: 2 })
  })

  it('releases a transient answer (its writes rolled back) as outcome released', async () => {
    const store = new TxMemoryStore()
    const ledger = new Ledger({ store })
    const k = key()
    const result = await ledger.runInTransaction({ key: k, payload: 1 }, () => 'busy', {
      encode: () => ({ status: 503, headers: {}, body: new Uint8Array(0) }),
    })
    expect(result).toMatchObject({ kind: 'executed', outcome: 'released', value: 'busy' })
    expect(store.committed).toEqual([])
    expect(await ledger.runInTransaction({ key: k, payload: 1 }, ({ token }) => token)).toMatchObject({ outcome: 'completed', value: 2 })
  })
})

describe('Ledger: errors a caller can hit name their code', () => {
  it('refuses a ledger without a store, and runInTransaction on a store without transactions, with INVALID_OPTION', async () => {
    expect(() => new Ledger({} as never)).toThrow(expect.objectContaining({ code: 'INVALID_OPTION' }))
    const ledger = new Ledger({ store: new MemoryStore() })
    await expect(async () => ledger.runInTransaction({ key: key(), payload: 1 }, () => 1)).rejects.toMatchObject({ code: 'INVALID_OPTION' })
  })
})
