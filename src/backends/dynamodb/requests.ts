/**
 * How the DynamoDB store sends a request: on your client or one it makes (the SDK loaded on first
 * use), bounded by `requestTimeout`, with only the attribute names the expressions use, and errors
 * turned into idemkey's (a failed condition comes through as is: it is an answer, not a failure).
 */
import { IdempotencyError, storeUnavailable } from '../../errors.js'
import { type DynamoDbClientLike, type DynamoDbSdk, errorName, loadSdk } from './client.js'

const CONDITION_FAILED = 'ConditionalCheckFailedException'

export interface DynamoDbRequestsOptions {
  table: string
  /** Your client; without it one is made from `clientConfig`, and `close()` destroys it. */
  client: DynamoDbClientLike | undefined
  clientConfig: Record<string, unknown> | undefined
  /** `0` bounds nothing. */
  requestTimeoutMs: number
  /** Every attribute name placeholder of the store's expressions; an input carrying this object gets only the ones it uses. */
  expressionNames: Record<string, string>
}

export class DynamoDbRequests {
  readonly #table: string
  readonly #exprNames: Record<string, string>
  readonly #namesCache = new Map<string, Record<string, string>>()
  readonly #requestTimeoutMs: number
  readonly #ownsClient: boolean
  readonly #clientConfig: Record<string, unknown>
  #client: DynamoDbClientLike | undefined
  #sdk: DynamoDbSdk | undefined

  constructor(options: DynamoDbRequestsOptions) {
    this.#table = options.table
    this.#exprNames = options.expressionNames
    this.#requestTimeoutMs = options.requestTimeoutMs
    this.#ownsClient = options.client === undefined
    this.#client = options.client
    this.#clientConfig = options.clientConfig ?? {}
  }

  /** Sends one command; a failed condition is rethrown as is, anything else becomes an idemkey error. */
  async send(operation: string, command: keyof DynamoDbSdk, input: Record<string, unknown>): Promise<unknown> {
    const sdk = this.#sdk ?? (await this.#loadSdk())
    const client = this.#client ?? this.#makeClient(sdk)
    // Aborting makes the SDK destroy the request's socket, so a half-open connection is not reused.
    const deadline = this.#requestTimeoutMs > 0 ? AbortSignal.timeout(this.#requestTimeoutMs) : undefined
    try {
      if (input.ExpressionAttributeNames === this.#exprNames) input.ExpressionAttributeNames = this.#usedNames(input)
      return await client.send(new sdk[command](input), deadline && { abortSignal: deadline })
    } catch (error) {
      if (isConditionFailed(error)) throw error
      throw this.#storeError(operation, deadline?.aborted ? new RequestTimeoutError(this.#requestTimeoutMs, error) : error)
    }
  }

  /** Destroys the client when the store made it; leaves yours open. */
  close(): void {
    // Your client stays the store's: a later call goes through it, never through one made behind your back.
    if (!this.#ownsClient) return
    this.#client?.destroy?.()
    this.#client = undefined
  }

  /** DynamoDB rejects unused placeholders: only the names the input's expressions use (cached per expression). */
  #usedNames(input: Record<string, unknown>): Record<string, string> {
    const text = `${input.ConditionExpression ?? ''} ${input.UpdateExpression ?? ''}`
    let used = this.#namesCache.get(text)
    if (used === undefined) {
      used = {}
      for (const [placeholder] of text.matchAll(/#\w+/g)) used[placeholder] = this.#exprNames[placeholder] as string
      this.#namesCache.set(text, used)
    }
    return used
  }

  async #loadSdk(): Promise<DynamoDbSdk> {
    this.#sdk = await loadSdk()
    return this.#sdk
  }

  #makeClient(sdk: DynamoDbSdk): DynamoDbClientLike {
    this.#client = new sdk.DynamoDBClient({ maxAttempts: 2, ...this.#clientConfig })
    return this.#client
  }

  #storeError(operation: string, error: unknown): IdempotencyError {
    if (errorName(error) === 'ResourceNotFoundException' && operation !== 'migrate') {
      return new IdempotencyError(
        'STORE_SCHEMA',
        `dynamodb: ${operation} found no table ${this.#table}. Create it with \`await store.migrate()\` (or as docs/dynamodb.md describes), or fix { table }.`,
        { cause: error },
      )
    }
    return storeUnavailable('dynamodb', operation, error)
  }
}

/** What a request unanswered within `requestTimeout` fails with (the cause of its STORE_UNAVAILABLE). */
class RequestTimeoutError extends Error {
  readonly code = 'IDEMKEY_REQUEST_TIMEOUT'
  constructor(timeoutMs: number, cause: unknown) {
    super(
      `no answer from DynamoDB within requestTimeout (${timeoutMs} ms); the request was abandoned and its connection dropped (half-open, or the endpoint is stalled)`,
      { cause },
    )
    this.name = 'RequestTimeoutError'
  }
}

/** The write's condition did not hold (the record is held, fenced, or gone). */
export function isConditionFailed(error: unknown): boolean {
  return errorName(error) === CONDITION_FAILED
}
