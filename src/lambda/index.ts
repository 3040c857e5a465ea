/**
 * `idemkey/lambda`: idempotency for AWS Lambda handlers (docs/lambda.md): API Gateway REST and HTTP APIs
 * and Function URLs, SQS batches with partial batch responses, and any event. Leases never outlive the
 * invocation that took them.
 *
 * @example
 * import { DynamoDbStore } from 'idemkey/dynamodb'
 * import { withIdempotency } from 'idemkey/lambda'
 * const ledger = new Ledger({ store: new DynamoDbStore({ table: 'idemkey' }) })
 * export const handler = withIdempotency(ledger, async (event) => ({ statusCode: 201, body: '{}' }))
 */
export type { IdempotencyContext } from '../http/types.js'
export { getIdempotency, type HttpEventLike, type HttpResultFor, type LambdaHttpOptions, principalOf, withIdempotency } from './http.js'
export { lambdaLedger } from './invocation.js'
export { type MakeIdempotentOptions, makeIdempotent } from './make-idempotent.js'
export { type SqsBatchOptions, sqsBatchHandler } from './sqs.js'
export type {
  ApiGatewayV1EventLike,
  ApiGatewayV1ResultLike,
  ApiGatewayV2EventLike,
  ApiGatewayV2ResultLike,
  LambdaContextLike,
  SqsBatchResponse,
  SqsEventLike,
  SqsRecordLike,
} from './types.js'
