/**
 * `idemkey/dynamodb`: the DynamoDB store, on `@aws-sdk/client-dynamodb` (docs/dynamodb.md).
 *
 * @example
 * import { DynamoDbStore } from 'idemkey/dynamodb'
 * const store = new DynamoDbStore({ table: 'idemkey' })
 */
export type { DynamoDbClientLike } from './client.js'
export { DynamoDbStore } from './dynamodb-store.js'
export type { DynamoDbStoreOptions } from './options.js'
export type { DynamoDbAttributeNames } from './schema.js'
