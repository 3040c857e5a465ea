/**
 * What a window of records costs to keep, per store (docs/scale.md): keys kept = writes/s x window, and
 * each record's bytes by the store's own measure, as bench/record-size.bench.ts measured them. Linear
 * between the measured body sizes, and past the largest along the slope of the last two.
 */

export type SizedStore = 'postgres' | 'mysql' | 'sqlite' | 'redis' | 'dynamodb'

/** The measurement this model is made of: the bench's command, its date, and bytes per record by body size. */
export const MEASURED = {
  command: 'npx tsx bench/record-size.bench.ts --records 20000',
  date: '2026-11-25',
  bodies: [16, 256, 1_024, 4_096],
  bytes: {
    postgres: [472, 765, 1_593, 6_031],
    mysql: [645, 1_067, 2_432, 7_966],
    sqlite: [364, 612, 1_351, 4_449],
    redis: [441, 671, 1_439, 5_280],
    dynamodb: [386, 626, 1_394, 4_466],
  } satisfies Record<SizedStore, number[]>,
} as const

export const STORE_LABELS: Record<SizedStore, string> = {
  postgres: 'PostgreSQL',
  mysql: 'MySQL/MariaDB',
  sqlite: 'SQLite',
  redis: 'Redis',
  dynamodb: 'DynamoDB',
}

/** What each store's figure counts, and what to add on top of it. */
export const STORE_NOTES: Record<SizedStore, string> = {
  postgres: 'table, TOAST and primary key, as VACUUM leaves them for reuse; add WAL, replicas and room for vacuum to work',
  mysql: 'InnoDB data and index pages; add redo/binlog, replicas and free space in pages',
  sqlite: 'database pages in use; add the WAL file and free pages',
  redis: 'used_memory; add fragmentation (mem_fragmentation_ratio), replicas, and fork copy-on-write room for persistence',
  dynamodb: 'item size by AWS rules plus 100 bytes of per-item overhead (what storage is billed on)',
}

/** DynamoDB on-demand list prices (us-east-1, since November 2024): override them for your region and date. */
export const DYNAMODB_PRICES = {
  /** US dollars per million write request units. */
  wruPerMillion: 0.625,
  /** US dollars per GB-month of table storage (Standard table class). */
  storagePerGbMonth: 0.25,
  source: 'AWS DynamoDB on-demand list prices, us-east-1, Standard table class, as of November 2024',
}

/** Bytes one record takes in `store` with a response body of `bodyBytes`. */
export function bytesPerRecord(store: SizedStore, bodyBytes: number): number {
  const xs = MEASURED.bodies
  const ys = MEASURED.bytes[store]
  if (bodyBytes <= (xs[0] as number)) return ys[0] as number
  let i = 1
  while (i < xs.length - 1 && bodyBytes > (xs[i] as number)) i++
  const [x0, x1, y0, y1] = [xs[i - 1], xs[i], ys[i - 1], ys[i]] as [number, number, number, number]
  return y0 + ((bodyBytes - x0) * (y1 - y0)) / (x1 - x0)
}

export interface SizeInput {
  /** New keys per second (intents that write). */
  writesPerSecond: number
  /** How long a record is kept (the store's TTL: replays and reuse checks within it). */
  windowMs: number
  /** Mean stored response body, bytes. */
  bodyBytes: number
}

export interface StoreSize {
  store: SizedStore
  label: string
  bytesPerRecord: number
  totalBytes: number
  note: string
  /** DynamoDB only: write request units per intent and what a month of them and of storage costs. */
  dynamodb?: { wruPerIntent: number; writesPerMonthUsd: number; storagePerMonthUsd: number }
}

export interface SizeEstimate {
  records: number
  stores: StoreSize[]
}

const SECONDS_PER_MONTH = 30.4375 * 86_400
const GIB = 1024 ** 3

/**
 * Records kept and the bytes they take, per store; for DynamoDB, a month's on-demand cost (each intent
 * writes twice: the acquire, a small item of one unit, and the completion, billed on the larger of the
 * item before and after, one unit per started KB).
 */
export function estimateSize(
  input: SizeInput,
  stores: readonly SizedStore[],
  prices: { wruPerMillion: number; storagePerGbMonth: number } = DYNAMODB_PRICES,
): SizeEstimate {
  const records = Math.round(input.writesPerSecond * (input.windowMs / 1_000))
  return {
    records,
    stores: stores.map((store) => {
      const perRecord = bytesPerRecord(store, input.bodyBytes)
      const size: StoreSize = {
        store,
        label: STORE_LABELS[store],
        bytesPerRecord: Math.round(perRecord),
        totalBytes: Math.round(perRecord * records),
        note: STORE_NOTES[store],
      }
      if (store === 'dynamodb') {
        const itemBytes = perRecord - 100
        const wruPerIntent = 1 + Math.max(1, Math.ceil(itemBytes / 1024))
        size.dynamodb = {
          wruPerIntent,
          writesPerMonthUsd: (input.writesPerSecond * SECONDS_PER_MONTH * wruPerIntent * prices.wruPerMillion) / 1e6,
          storagePerMonthUsd: ((perRecord * records) / GIB) * prices.storagePerGbMonth,
        }
      }
      return size
    }),
  }
}
