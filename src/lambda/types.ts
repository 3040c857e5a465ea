/**
 * The parts of the AWS Lambda event and context shapes the wrappers read, declared here so the package
 * needs no `@types/aws-lambda`. The types from `aws-lambda` (`APIGatewayProxyEvent`, `SQSEvent`, `Context`, …)
 * are assignable to them.
 */

/** What the wrappers use of the Lambda `context`. */
export interface LambdaContextLike {
  /** Milliseconds left before Lambda stops the invocation. */
  getRemainingTimeInMillis(): number
  awsRequestId?: string | undefined
  /** The function's name (without version or alias): `makeIdempotent`'s default scope. */
  functionName?: string | undefined
}

type Headers = Record<string, string | undefined> | null | undefined

/** An API Gateway REST API (payload format 1.0) proxy event. */
export interface ApiGatewayV1EventLike {
  httpMethod: string
  path: string
  headers: Headers
  multiValueHeaders?: Record<string, string[] | undefined> | null | undefined
  queryStringParameters?: Record<string, string | undefined> | null | undefined
  multiValueQueryStringParameters?: Record<string, string[] | undefined> | null | undefined
  body: string | null
  isBase64Encoded: boolean
  requestContext?:
    | {
        authorizer?: Record<string, unknown> | null | undefined
        identity?: { userArn?: string | null | undefined; cognitoIdentityId?: string | null | undefined } | null | undefined
      }
    | null
    | undefined
}

/** An HTTP API (payload format 2.0) or Lambda Function URL event. */
export interface ApiGatewayV2EventLike {
  version: string
  rawPath: string
  rawQueryString: string
  headers: Headers
  cookies?: string[] | undefined
  body?: string | undefined
  isBase64Encoded: boolean
  requestContext: {
    http: { method: string }
    authorizer?:
      | {
          jwt?: { claims?: Record<string, unknown> | undefined } | null | undefined
          lambda?: Record<string, unknown> | null | undefined
          iam?: { userArn?: string | null | undefined; userId?: string | null | undefined } | null | undefined
          principalId?: string | null | undefined
        }
      | null
      | undefined
  }
}

/** A REST API (1.0) proxy result. */
export interface ApiGatewayV1ResultLike {
  statusCode: number
  headers?: Record<string, boolean | number | string> | undefined
  multiValueHeaders?: Record<string, Array<boolean | number | string>> | undefined
  body: string
  isBase64Encoded?: boolean | undefined
}

/** An HTTP API (2.0) or Function URL structured result. */
export interface ApiGatewayV2ResultLike {
  statusCode?: number | undefined
  headers?: Record<string, boolean | number | string> | undefined
  cookies?: string[] | undefined
  body?: string | undefined
  isBase64Encoded?: boolean | undefined
}

/** One SQS record of a batch. */
export interface SqsRecordLike {
  messageId: string
  body: string
  eventSourceARN?: string | undefined
  messageAttributes?: Record<string, { stringValue?: string | undefined; dataType?: string | undefined } | undefined>
}

/** An SQS batch event. */
export interface SqsEventLike {
  Records: SqsRecordLike[]
}

/** A partial batch response: the records to deliver again. */
export interface SqsBatchResponse {
  batchItemFailures: { itemIdentifier: string }[]
}
