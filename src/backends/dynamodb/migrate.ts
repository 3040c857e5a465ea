/**
 * The DynamoDB store's `migrate()`: creates the table (on-demand capacity) when it does not exist,
 * waits until it is active, checks its key schema, and turns TTL on.
 */
import { IdempotencyError } from '../../errors.js'
import { errorName } from './client.js'
import type { DynamoDbRequests } from './requests.js'
import type { ResolvedNames } from './schema.js'

/** How long `migrate()` waits for a new table to become active. */
const ACTIVE_WITHIN_MS = 120_000
const ACTIVE_POLL_MS = 250

export async function migrateTable(requests: DynamoDbRequests, table: string, names: ResolvedNames): Promise<void> {
  const keySchema = [{ AttributeName: names.partitionKey, KeyType: 'HASH' }]
  const definitions = [{ AttributeName: names.partitionKey, AttributeType: 'S' }]
  if (names.sortKey !== undefined) {
    keySchema.push({ AttributeName: names.sortKey, KeyType: 'RANGE' })
    definitions.push({ AttributeName: names.sortKey, AttributeType: 'S' })
  }
  try {
    await requests.send('migrate', 'CreateTableCommand', {
      TableName: table,
      KeySchema: keySchema,
      AttributeDefinitions: definitions,
      BillingMode: 'PAY_PER_REQUEST',
    })
  } catch (error) {
    if (errorName((error as { cause?: unknown }).cause) !== 'ResourceInUseException') throw error
  }
  const deadline = Date.now() + ACTIVE_WITHIN_MS
  for (;;) {
    const described = (await requests.send('migrate', 'DescribeTableCommand', { TableName: table })) as {
      Table?: { TableStatus?: string; KeySchema?: { AttributeName: string; KeyType: string }[] }
    }
    const found = (described.Table?.KeySchema ?? []).map((k) => `${k.AttributeName}:${k.KeyType}`).sort()
    const wanted = keySchema.map((k) => `${k.AttributeName}:${k.KeyType}`).sort()
    if (found.join() !== wanted.join()) {
      throw new IdempotencyError(
        'STORE_SCHEMA',
        `dynamodb: table ${table} has the key schema (${found.join(', ')}), but the store is configured for (${wanted.join(', ')}). Set { attributes: { partitionKey, sortKey } } to the table's keys, or use another table.`,
      )
    }
    if (described.Table?.TableStatus === 'ACTIVE') break
    if (Date.now() > deadline) {
      throw new IdempotencyError(
        'STORE_UNAVAILABLE',
        `dynamodb: table ${table} did not become ACTIVE within 2 minutes (status ${described.Table?.TableStatus}). Call migrate() again.`,
      )
    }
    await new Promise((resolve) => setTimeout(resolve, ACTIVE_POLL_MS))
  }
  try {
    await requests.send('migrate', 'UpdateTimeToLiveCommand', {
      TableName: table,
      TimeToLiveSpecification: { Enabled: true, AttributeName: names.ttl },
    })
  } catch (error) {
    const cause = (error as { cause?: unknown }).cause
    const message = cause instanceof Error ? cause.message : ''
    // Already on (a second migrate), or an emulator without TTL (dynalite): reads ignore expired items anyway.
    if (/already enabled/i.test(message) || errorName(cause) === 'UnknownOperationException') return
    throw error
  }
}
