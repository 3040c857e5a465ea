/**
 * list({ limit }) takes a non-negative integer on every store: the embedded stores refuse anything else
 * with INVALID_ARGUMENT, as the server stores do, instead of listing every record (SQLite's LIMIT -1),
 * every record but the last (an array's slice(0, -1)), or failing as if the store were down.
 */
import { describe, expect, it } from 'vitest'
import { MemoryStore } from '../src/backends/memory/index.js'
import type { IdempotencyStore } from '../src/core/store.js'
import { fp } from '../src/testing/index.js'
import { SQLITE_DRIVERS, storeOn } from './helpers/sqlite-drivers.js'

const stores: Array<[string, () => IdempotencyStore]> = [
  ['memory', () => new MemoryStore()],
  ...SQLITE_DRIVERS.map((driver): [string, () => IdempotencyStore] => [`sqlite (${driver})`, () => storeOn(driver, { path: ':memory:' })]),
]

describe.each(stores)('%s: list limit', (_name, open) => {
  it('refuses a negative or fractional list limit with INVALID_ARGUMENT, and lists nothing for 0', async () => {
    const store = open()
    for (const key of ['a', 'b', 'c']) await store.acquire('limit', key, fp('a'), 60_000)
    for (const limit of [-1, 1.5, Number.NaN]) {
      await expect(store.list({ limit })).rejects.toEqual(
        expect.objectContaining({ code: 'INVALID_ARGUMENT', message: `list limit must be a non-negative integer, got ${String(limit)}.` }),
      )
    }
    expect(await store.list({ limit: 0 })).toEqual([])
    expect((await store.list({ limit: 2 })).map((record) => record.key)).toEqual(['a', 'b'])
    await store.close()
  })
})
