import { formatDuration } from '../../core/duration.js'
import { durationOption, positiveArg, sizeOption } from '../options.js'
import { printJson, renderTable } from '../output.js'
import { type Command, Option } from '../program.js'
import { DYNAMODB_PRICES, estimateSize, MEASURED, type SizedStore, STORE_LABELS } from './size-model.js'

const STORES = Object.keys(STORE_LABELS) as SizedStore[]

const bytes = (n: number) => {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB']
  let value = n
  let unit = 0
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024
    unit++
  }
  return `${value >= 100 || unit === 0 ? Math.round(value).toLocaleString('en-US') : value.toFixed(1)} ${units[unit]}`
}
const usd = (n: number) => `$${n >= 100 ? Math.round(n).toLocaleString('en-US') : n.toFixed(2)}`

/** `idemkey size`: what keeping a window of records takes, per store, from measured bytes per record. */
export function registerSize(program: Command): void {
  program
    .command('size')
    .description('estimate the records, storage or memory (and DynamoDB cost) a write rate and window need')
    .requiredOption('--writes <per-second>', 'new keys per second (intents that write)', positiveArg('--writes'))
    .addOption(
      durationOption(
        '--window <duration>',
        'how long records are kept (the TTL)',
        '24h',
        'a window of 0 keeps no record, so there is nothing to size',
      ),
    )
    .addOption(sizeOption('--body <size>', 'mean stored response body', '1kb'))
    .addOption(new Option('--store <store>', 'one store only').choices(STORES))
    .option(
      '--wru-price <usd>',
      'DynamoDB: US dollars per million write request units',
      positiveArg('--wru-price'),
      DYNAMODB_PRICES.wruPerMillion,
    )
    .option(
      '--storage-price <usd>',
      'DynamoDB: US dollars per GB-month of storage',
      positiveArg('--storage-price'),
      DYNAMODB_PRICES.storagePerGbMonth,
    )
    .option('--json', 'print the estimate as JSON')
    .addHelpText(
      'after',
      `
Examples:
  idemkey size --writes 5000                        the design doc's case: 5,000 writes/s kept for 24h
  idemkey size --writes 200 --window 7d --body 4kb --store postgres
  idemkey size --writes 5000 --store dynamodb --wru-price 0.7425 --json

Bytes per record were measured per store by \`${MEASURED.command}\` (${MEASURED.date}; docs/scale.md),
linear between the measured body sizes (${MEASURED.bodies.join(', ')} bytes).`,
    )
    .action(
      (options: {
        writes: number
        window: number
        body: number
        store?: SizedStore
        wruPrice: number
        storagePrice: number
        json?: boolean
      }) => {
        const estimate = estimateSize(
          { writesPerSecond: options.writes, windowMs: options.window, bodyBytes: options.body },
          options.store ? [options.store] : STORES,
          { wruPerMillion: options.wruPrice, storagePerGbMonth: options.storagePrice },
        )
        const source = `bytes per record measured by \`${MEASURED.command}\` on ${MEASURED.date} (docs/scale.md)`
        if (options.json) {
          printJson({
            writesPerSecond: options.writes,
            windowMs: options.window,
            bodyBytes: options.body,
            records: estimate.records,
            stores: estimate.stores,
            source,
            ...(estimate.stores.some((s) => s.dynamodb)
              ? {
                  dynamodbPrices: {
                    wruPerMillion: options.wruPrice,
                    storagePerGbMonth: options.storagePrice,
                    source: DYNAMODB_PRICES.source,
                  },
                }
              : {}),
          })
          return
        }
        const lines = [
          `${options.writes.toLocaleString('en-US')} writes/s kept for ${formatDuration(options.window)}: ${estimate.records.toLocaleString('en-US')} records (${estimate.records.toExponential(2).replace('e+', ' x 10^')}), mean body ${bytes(options.body)}`,
          '',
          renderTable(
            ['store', 'per record', 'total', 'what it counts'],
            estimate.stores.map((s) => [s.label, `${s.bytesPerRecord.toLocaleString('en-US')} B`, bytes(s.totalBytes), s.note]),
          ),
        ]
        const dynamo = estimate.stores.find((s) => s.dynamodb)?.dynamodb
        if (dynamo) {
          lines.push(
            '',
            `DynamoDB on demand: ${dynamo.wruPerIntent} write units per intent (acquire 1, completion by item size): ${usd(dynamo.writesPerMonthUsd)}/month for writes, ${usd(dynamo.storagePerMonthUsd)}/month for storage; replays and retries add an acquire each.`,
            `Prices: $${options.wruPrice} per million write units, $${options.storagePrice} per GB-month${options.wruPrice === DYNAMODB_PRICES.wruPerMillion && options.storagePrice === DYNAMODB_PRICES.storagePerGbMonth ? ` (${DYNAMODB_PRICES.source}; --wru-price and --storage-price for yours)` : ''}.`,
          )
        }
        lines.push('', `Figures: ${source}, linear between the measured body sizes.`)
        process.stdout.write(`${lines.join('\n')}\n`)
      },
    )
}
