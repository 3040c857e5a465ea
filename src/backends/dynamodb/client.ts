import { IdempotencyError } from '../../errors.js'

/**
 * What the store uses of a `DynamoDBClient` from `@aws-sdk/client-dynamodb`, declared structurally so
 * the store accepts your client without importing the SDK's types.
 */
export interface DynamoDbClientLike {
  send(command: unknown, options?: unknown): Promise<unknown>
  destroy?(): void
}

/** The command classes the store sends, loaded from `@aws-sdk/client-dynamodb` on first use. */
export interface DynamoDbSdk {
  DynamoDBClient: new (config: Record<string, unknown>) => DynamoDbClientLike
  GetItemCommand: new (input: Record<string, unknown>) => unknown
  UpdateItemCommand: new (input: Record<string, unknown>) => unknown
  DeleteItemCommand: new (input: Record<string, unknown>) => unknown
  ScanCommand: new (input: Record<string, unknown>) => unknown
  CreateTableCommand: new (input: Record<string, unknown>) => unknown
  DescribeTableCommand: new (input: Record<string, unknown>) => unknown
  UpdateTimeToLiveCommand: new (input: Record<string, unknown>) => unknown
}

let loading: Promise<DynamoDbSdk> | undefined

/** Loads the SDK once; a missing package says how to install it. */
export function loadSdk(): Promise<DynamoDbSdk> {
  loading ??= import('@aws-sdk/client-dynamodb').then(
    (sdk) => sdk as unknown as DynamoDbSdk,
    (error: unknown) => {
      loading = undefined
      throw new IdempotencyError(
        'INVALID_OPTION',
        'DynamoDbStore needs the @aws-sdk/client-dynamodb package, which is not installed where idemkey is. Install it beside idemkey: npm i @aws-sdk/client-dynamodb (the Lambda Node.js runtimes ship it, but bundle your own version for a pinned one).',
        { cause: error },
      )
    },
  )
  return loading
}

/** The name of an SDK error (`ConditionalCheckFailedException`, `ResourceNotFoundException`, …). */
export function errorName(error: unknown): string | undefined {
  return (error as { name?: unknown } | null)?.name as string | undefined
}
