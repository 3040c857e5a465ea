/**
 * DynamoDbStore benchmark against a dynalite server on a loopback port (or IDEMKEY_DYNAMODB_ENDPOINT):
 * acquire+complete cycles/s and replays/s at 1 and 10 concurrent callers, beside the same requests issued
 * through the raw SDK client (a conditional UpdateItem then a fenced UpdateItem per cycle; one
 * UpdateItem that fails its condition per replay), measured in the same run on the same server. dynalite
 * is an emulator in one Node process: the figures compare the store's overhead with the SDK's, not
 * DynamoDB's own latency (single-digit milliseconds per request in a region).
 * Run alone: npx tsx bench/dynamodb.bench.ts [--ms 1500]
 */
import { randomUUID } from 'node:crypto'
import { ConditionalCheckFailedException, UpdateItemCommand } from '@aws-sdk/client-dynamodb'
import { DynamoDbStore } from '../src/backends/dynamodb/index.js'
import { fingerprintOf } from '../src/core/fingerprint.js'
import type { Outcome } from '../src/core/store.js'
import { startDynamoDb } from '../test/helpers/dynalite.js'
import { fmt, opsPerSecond, report, table } from './lib.js'

const msArg = process.argv.indexOf('--ms')
const MS = msArg > 0 ? Number(process.argv[msArg + 1]) : 1_500
const CALLERS = [1, 10]
const fp = fingerprintOf({ amount: 100 })
const body = new TextEncoder().encode('{"id":"ch_1","amount":100}')
const outcome: Outcome = { status: 'completed', response: { status: 201, headers: { 'content-type': 'application/json' }, body } }

const dynamo = await startDynamoDb()
const table_ = dynamo.table('bench')
const client = dynamo.client()
const store = new DynamoDbStore({ table: table_, client })
await store.migrate()
const run = randomUUID().slice(0, 8)

/** The two writes of a cycle, as a hand-written SDK user would send them. */
async function rawCycle(i: number): Promise<void> {
  const Key = { pk: { S: `raw#${run}\n${i}` } }
  await client.send(
    new UpdateItemCommand({
      TableName: table_,
      Key,
      ConditionExpression: 'attribute_not_exists(pk)',
      UpdateExpression: 'SET fp = :fp, st = :st, tok = :one, lu = :lu',
      ExpressionAttributeValues: {
        ':fp': { S: fp },
        ':st': { S: 'in_progress' },
        ':one': { N: '1' },
        ':lu': { N: String(Date.now() + 30_000) },
      },
    }),
  )
  await client.send(
    new UpdateItemCommand({
      TableName: table_,
      Key,
      ConditionExpression: 'tok = :one AND st = :inprog',
      UpdateExpression: 'SET st = :st, rs = :rs, rb = :rb REMOVE lu',
      ExpressionAttributeValues: {
        ':one': { N: '1' },
        ':inprog': { S: 'in_progress' },
        ':st': { S: 'completed' },
        ':rs': { N: '201' },
        ':rb': { B: body },
      },
    }),
  )
}

async function rawReplay(i: number): Promise<void> {
  try {
    await client.send(
      new UpdateItemCommand({
        TableName: table_,
        Key: { pk: { S: `raw#${run}\n${i % 100}` } },
        ConditionExpression: 'attribute_not_exists(pk)',
        UpdateExpression: 'SET st = :st',
        ExpressionAttributeValues: { ':st': { S: 'in_progress' } },
        ReturnValuesOnConditionCheckFailure: 'ALL_OLD',
      }),
    )
  } catch (error) {
    if (!(error instanceof ConditionalCheckFailedException)) throw error
  }
}

async function cycle(i: number): Promise<void> {
  const acquired = await store.acquire(`bench-${run}`, `c${i}`, fp, 30_000)
  if (acquired.kind !== 'acquired') throw new Error(`expected acquired, got ${acquired.kind}`)
  if (!(await store.complete(`bench-${run}`, `c${i}`, acquired.token, outcome, 3_600_000))) throw new Error('complete refused')
}

async function replay(i: number): Promise<void> {
  const result = await store.acquire(`bench-${run}`, `r${i % 100}`, fp, 30_000)
  if (result.kind !== 'replay') throw new Error(`expected replay, got ${result.kind}`)
}

for (let i = 0; i < 100; i++) {
  await cycle(-i - 1).catch(() => {})
  const acquired = await store.acquire(`bench-${run}`, `r${i}`, fp, 30_000)
  if (acquired.kind === 'acquired') await store.complete(`bench-${run}`, `r${i}`, acquired.token, outcome, 3_600_000)
  await rawCycle(i)
}

const offset = { raw: 1_000_000, store: 1_000_000 }
const rows: Array<Array<string | number>> = []
for (const callers of CALLERS) {
  const rawCycles = await opsPerSecond((i) => rawCycle(offset.raw + i), MS, callers)
  offset.raw += 10_000_000
  const cycles = await opsPerSecond((i) => cycle(offset.store + i), MS, callers)
  offset.store += 10_000_000
  const rawReplays = await opsPerSecond(rawReplay, MS, callers)
  const replays = await opsPerSecond(replay, MS, callers)
  rows.push([
    callers,
    fmt(rawCycles),
    fmt(cycles),
    `${fmt((cycles / rawCycles) * 100)} %`,
    fmt(rawReplays),
    fmt(replays),
    `${fmt((replays / rawReplays) * 100)} %`,
  ])
}

await store.close()
await dynamo.stop()

report(
  'dynamodb',
  'DynamoDbStore (dynalite)',
  'npx tsx bench/dynamodb.bench.ts',
  `${table(
    ['callers', 'raw SDK cycles/s', 'store cycles/s', 'store / raw', 'raw SDK replays/s', 'store replays/s', 'store / raw'],
    rows,
  )}\n\nA cycle is acquire then complete: two conditional UpdateItem requests, both for the store and for the raw SDK loop. A replay is one UpdateItem that fails its condition; against dynalite, which does not return the item with the failure, the store then reads it (a second request), so its replays cost two requests here and one on DynamoDB. dynalite runs in the benchmark's own process, so these are the store's and the SDK's overhead, not DynamoDB's latency.`,
)
