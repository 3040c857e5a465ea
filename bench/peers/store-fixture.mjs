/** What the store benches (store-cpu.mjs, store-ab.mjs) complete each record with, and their constants. */

// The peers bench's answer: 201, the two headers idemkey stores, a 62-byte JSON body.
export const response = {
  status: 201,
  headers: { 'content-type': 'application/json; charset=utf-8', etag: 'W/"3e-HFLSubzWNSlMn4fyyXuUJFDMMLQ"' },
  body: new TextEncoder().encode(JSON.stringify({ id: 'ch_2616841a-800a-44aa-9219-20fd9f269c3b', amount: 1299 })),
}
export const outcome = { status: 'completed', response }
export const FINGERPRINT = 'a'.repeat(64)
export const DAY = 86_400_000
