/**
 * The parts of the AWS Lambda event and context shapes the wrappers read, declared here so the package
 * needs no `@types/aws-lambda`. The types from `aws-lambda` (`APIGatewayProxyEvent`, `SQSEvent`, `Context`, …)
 * are assignable to them.
 */

/** What the wrappers use of the Lambda `context`. */
export interface LambdaContextLike {
  /** Milliseconds left before Lambda stops the invocation. */
  getRemainingTimeInMillis(): number
  awsRequestId?: string
  /** The function's name (without version or alias): `makeIdempotent`'s default scope. */
  functionName?: string
}

type Headers = Record<string, string | undefined> | null | undefined

/** An API Gateway REST API (payload format 1.0) proxy event. */
export interface ApiGatewayV1EventLike {
  httpMethod: string
  path: string
  headers: Headers
  multiValueHeaders?: Record<string, string[] | undefined> | null
  queryStringParameters?: Record<string, string | undefined> | null
  multiValueQueryStringParameters?: Record<string, string[] | undefined> | null
  body: string | null
  isBase64Encoded: boolean
  requestContext?: {
    authorizer?: Record<string, unknown> | null
    identity?: { userArn?: string | null; cognitoIdentityId?: string | null } | null
  } | null
}

/** An HTTP API (payload format 2.0) or Lambda Function URL event. */
export interface ApiGatewayV2EventLike {
  version: string
  rawPath: string
  rawQueryString: string
  headers: Headers
  cookies?: string[]
  body?: string
  isBase64Encoded: boolean
  requestContext: {
    http: { method: string }
    authorizer?: {
      jwt?: { claims?: Record<string, unknown> } | null
      lambda?: Record<string, unknown> | null
      iam?: { userArn?: string | null; userId?: string | null } | null
      principalId?: string
    } | null
  }
}

/** A REST API (1.0) proxy result. */
export interface ApiGatewayV1ResultLike {
  statusCode: number
  headers?: Record<string, boolean | number | string>
  multiValueHeaders?: Record<string, Array<boolean | number | string>>
  body: string
  isBase64Encoded?: boolean
}

/** An HTTP API (2.0) or Function URL structured result. */
export interface ApiGatewayV2ResultLike {
  statusCode?: number
  headers?: Record<string, boolean | number | string>
  cookies?: string[]
  body?: string
  isBase64Encoded?: boolean
}

/** One SQS record of a batch. */
export interface SqsRecordLike {
  messageId: string
  body: string
  eventSourceARN?: string
  messageAttributes?: Record<string, { stringValue?: string; dataType?: string } | undefined>
}

/** An SQS batch event. */
export interface SqsEventLike {
  Records: SqsRecordLike[]
}

/** A partial batch response: the records to deliver again. */
export interface SqsBatchResponse {
  batchItemFailures: { itemIdentifier: string }[]
}
