/**
 * `idemkey size`: records kept = writes/s x window; bytes per record are the measured figures
 * (bench/record-size.bench.ts) at the measured body sizes and linear between them; DynamoDB's write units
 * and month's cost follow from the item size; bad input is refused with what was expected.
 */
import { join } from 'node:path'
import { bytesPerRecord, estimateSize, MEASURED } from '../src/cli/commands/size-model.js'
import { runNode } from './helpers/cli.js'

const BIN = join(import.meta.dirname, '..', 'bin/idemkey.js')
const cli = (...args: string[]) => runNode([BIN, 'size', ...args])

describe('idemkey size', () => {
  it("keeps writes/s x window records: the design doc's 5,000/s for 24 h is 4.32 x 10^8", async () => {
    expect(estimateSize({ writesPerSecond: 5_000, windowMs: 86_400_000, bodyBytes: 1_024 }, ['postgres']).records).toBe(432_000_000)
    expect(estimateSize({ writesPerSecond: 0.5, windowMs: 3_600_000, bodyBytes: 0 }, ['redis']).records).toBe(1_800)
  })

  it('uses the measured bytes per record at a measured body size, linear between two, along the last slope past the largest', async () => {
    MEASURED.bodies.forEach((body, i) => {
      expect(bytesPerRecord('postgres', body)).toBe(MEASURED.bytes.postgres[i])
    })
    const [b1, b2] = [MEASURED.bodies[1], MEASURED.bodies[2]] as [number, number]
    const [y1, y2] = [MEASURED.bytes.redis[1], MEASURED.bytes.redis[2]] as [number, number]
    expect(bytesPerRecord('redis', (b1 + b2) / 2)).toBeCloseTo((y1 + y2) / 2, 6)
    // Below the smallest measured body: the smallest record (the key, fingerprint and head do not shrink).
    expect(bytesPerRecord('sqlite', 0)).toBe(MEASURED.bytes.sqlite[0])
    const last = MEASURED.bodies.length - 1
    const slope =
      ((MEASURED.bytes.mysql[last] as number) - (MEASURED.bytes.mysql[last - 1] as number)) /
      ((MEASURED.bodies[last] as number) - (MEASURED.bodies[last - 1] as number))
    expect(bytesPerRecord('mysql', (MEASURED.bodies[last] as number) + 1_000)).toBeCloseTo(
      (MEASURED.bytes.mysql[last] as number) + 1_000 * slope,
      6,
    )
  })

  it("charges DynamoDB one write unit for the acquire and one per started KB of the completed item, and bills storage on the items' bytes", async () => {
    const small = estimateSize({ writesPerSecond: 100, windowMs: 86_400_000, bodyBytes: 16 }, ['dynamodb'], {
      wruPerMillion: 1,
      storagePerGbMonth: 1,
    })
    const item = small.stores[0]
    expect(item?.dynamodb?.wruPerIntent).toBe(2)
    // 100 intents/s over an average month, 2 units each, at $1 per million units.
    expect(item?.dynamodb?.writesPerMonthUsd).toBeCloseTo((100 * 30.4375 * 86_400 * 2) / 1e6, 6)
    expect(item?.dynamodb?.storagePerMonthUsd).toBeCloseTo((item?.totalBytes ?? 0) / 1024 ** 3, 3)
    const large = estimateSize({ writesPerSecond: 100, windowMs: 1_000, bodyBytes: 4_096 }, ['dynamodb'])
    expect(large.stores[0]?.dynamodb?.wruPerIntent).toBe(1 + Math.ceil(((MEASURED.bytes.dynamodb[3] as number) - 100) / 1024))
  })

  it('prints every store with its figure, total and what it counts, and where the figures come from', async () => {
    const { code, stdout } = await cli('--writes', '5000')
    expect(code).toBe(0)
    expect(stdout).toContain('432,000,000 records')
    for (const label of ['PostgreSQL', 'MySQL/MariaDB', 'SQLite', 'Redis', 'DynamoDB']) expect(stdout).toContain(label)
    expect(stdout).toContain(`\`${MEASURED.command}\` on ${MEASURED.date}`)
    expect(stdout).toMatch(/DynamoDB on demand: \d+ write units per intent/)
  })

  it('answers JSON for one store, with the inputs it used', async () => {
    const { code, stdout } = await cli('--writes', '5k', '--window', '7d', '--body', '4kb', '--store', 'postgres', '--json')
    expect(code).toBe(0)
    const out = JSON.parse(stdout) as {
      records: number
      bodyBytes: number
      stores: Array<{ store: string; bytesPerRecord: number; totalBytes: number }>
    }
    expect(out.records).toBe(5_000 * 7 * 86_400)
    expect(out.bodyBytes).toBe(4_096)
    expect(out.stores.map((s) => s.store)).toEqual(['postgres'])
    expect(out.stores[0]?.bytesPerRecord).toBe(MEASURED.bytes.postgres[3])
    expect(out.stores[0]?.totalBytes).toBe((MEASURED.bytes.postgres[3] as number) * out.records)
  })

  it('refuses a missing or bad rate, an unknown store and a bad window with what it expected, exit code 1', async () => {
    expect((await cli()).stderr).toContain("required option '--writes <per-second>' not specified")
    const negative = await cli('--writes', '-5')
    expect([negative.code, negative.stderr]).toEqual([
      1,
      expect.stringContaining('--writes expects a positive number such as 5000, 12.5 or 5k, got "-5"'),
    ])
    expect((await cli('--writes', '10', '--store', 'oracle')).stderr).toContain(
      'Allowed choices are postgres, mysql, sqlite, redis, dynamodb',
    )
    expect((await cli('--writes', '10', '--window', 'soon')).code).toBe(1)
  })
})
