/**
 * What canonicalizing a JSON request body costs, per request: the lossless scanner on the bytes
 * (`canonicalJsonText`) against parsing first and canonicalizing the parsed value, on a typical
 * ~300-byte payment body and a ~20 KiB order. Prints a table; writes nothing.
 *
 * Run: npx tsx bench/canonical-json.bench.ts
 */
import { cpus } from 'node:os'
import { canonicalJson } from '../src/core/canonical-json.js'
import { canonicalJsonText } from '../src/core/canonical-json-text.js'
import { fmt, table } from './lib.js'

const decoder = new TextDecoder('utf-8', { fatal: true })
const encoder = new TextEncoder()

/** The canonicalJson before the lossless rewrite (recursive, via doubles), for reference. */
function previousCanonicalJson(value: unknown): string {
  switch (typeof value) {
    case 'string':
    case 'boolean':
      return JSON.stringify(value)
    case 'number':
      if (!Number.isFinite(value)) throw new Error(`Cannot canonicalize ${value}`)
      return JSON.stringify(value)
    case 'object': {
      if (value === null) return 'null'
      if (Array.isArray(value)) {
        let out = '['
        for (let i = 0; i < value.length; i++) {
          if (i > 0) out += ','
          out += previousCanonicalJson(value[i] ?? null)
        }
        return `${out}]`
      }
      const record = value as Record<string, unknown>
      if (typeof (record as { toJSON?: unknown }).toJSON === 'function')
        return previousCanonicalJson((record as { toJSON: () => unknown }).toJSON())
      let out = '{'
      for (const k of Object.keys(record).sort()) {
        const item = record[k]
        if (item === undefined || typeof item === 'function') continue
        out += `${out.length > 1 ? ',' : ''}${JSON.stringify(k)}:${previousCanonicalJson(item)}`
      }
      return `${out}}`
    }
    default:
      throw new Error(`Cannot canonicalize a ${typeof value}`)
  }
}

const payment = {
  amount: 12_000,
  currency: 'eur',
  description: 'Order #10423 — 2 × espresso beans, 1 kg',
  customer: 'cus_9s6XKzkNRiz8i3',
  payment_method: 'pm_1MqLiJLkdIwHu7ixUEgbFdYF',
  confirm: true,
  capture_method: 'automatic',
  metadata: { order_id: '10423', channel: 'web', fraud_score: 0.12 },
  receipt_email: 'jenny.rosen@example.com',
}

const order = {
  id: 'ord_7f3a9c',
  created_at: '2024-05-01T12:34:56.789Z',
  customer: { id: 'cus_42', name: 'Jenny Rosen', email: 'jenny.rosen@example.com', vip: false },
  shipping: { line1: '1 Rue de Rivoli', city: 'Paris', postal_code: '75001', country: 'FR' },
  items: Array.from({ length: 138 }, (_, i) => ({
    sku: `SKU-${1000 + i}`,
    name: `Item number ${i} with a longer descriptive name`,
    quantity: (i % 5) + 1,
    unit_price: 1999 + i * 10,
    discount: i % 3 === 0 ? 0.15 : 0,
    tags: ['catalog', i % 2 === 0 ? 'even' : 'odd'],
  })),
  notes: 'Leave at the door. Ring twice.',
}

const bodies: Array<[string, Uint8Array]> = [
  ['payment', encoder.encode(JSON.stringify(payment))],
  ['order', encoder.encode(JSON.stringify(order))],
]

const ways: Array<[string, (bytes: Uint8Array) => string | undefined]> = [
  ['canonicalJsonText(bytes)', (bytes) => canonicalJsonText(bytes)],
  ['canonicalJson(JSON.parse(decode(bytes)))', (bytes) => canonicalJson(JSON.parse(decoder.decode(bytes)))],
  ['previous canonicalJson(JSON.parse(decode(bytes)))', (bytes) => previousCanonicalJson(JSON.parse(decoder.decode(bytes)))],
]

/** Nanoseconds per call: the best of several rounds of about 200 ms, the ways interleaved so drift hits all alike. */
function measure(bytes: Uint8Array): number[] {
  const best = ways.map(() => Number.POSITIVE_INFINITY)
  let sink = 0
  for (let round = 0; round < 7; round++) {
    ways.forEach(([, fn], w) => {
      let calls = 0
      const start = performance.now()
      let now = start
      while (now - start < 200) {
        for (let i = 0; i < 100; i++) sink += fn(bytes)?.length ?? 0
        calls += 100
        now = performance.now()
      }
      best[w] = Math.min(best[w]!, ((now - start) * 1e6) / calls)
    })
  }
  if (sink === 0) throw new Error('nothing measured')
  return best
}

for (const [, bytes] of bodies) {
  const texts = ways.map(([, fn]) => fn(bytes))
  if (new Set(texts).size !== 1) throw new Error('the ways disagree on the canonical text')
}

const rows: Array<Array<string | number>> = []
for (const [name, bytes] of bodies) {
  const ns = measure(bytes)
  ways.forEach(([way], w) => {
    rows.push([`${name} (${fmt(bytes.byteLength)} B)`, way, fmt(ns[w]! / 1_000, 2), `${fmt(ns[w]! / ns[1]!, 2)}x`])
  })
}
console.log(`${cpus().length} cores (${cpus()[0]?.model ?? 'unknown CPU'}), Node ${process.version}\n`)
console.log(table(['body', 'way', 'µs per call', 'vs parse + canonicalJson'], rows))
