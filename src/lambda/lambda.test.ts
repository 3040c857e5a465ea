import { randomUUID } from 'node:crypto'
import type { APIGatewayProxyEvent, APIGatewayProxyEventV2, Context, SQSEvent, SQSRecord } from 'aws-lambda'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { type DynamoDbEndpoint, startDynamoDb } from '../../test/helpers/dynalite.js'
import { DynamoDbStore } from '../backends/dynamodb/index.js'
import { MemoryStore } from '../backends/memory/index.js'
import { Ledger } from '../core/ledger.js'
import { isIdempotencyError } from '../errors.js'
import { lambdaLedger, makeIdempotent, sqsBatchHandler, withIdempotency } from './index.js'

// The wrappers invoked in-process with the event shapes Lambda delivers, the records in DynamoDbStore on a
// dynalite server. Events are typed with @types/aws-lambda, so the wrappers accept the real types.

let dynamo: DynamoDbEndpoint
let store: DynamoDbStore
let ledger: Ledger

beforeAll(async () => {
  dynamo = await startDynamoDb()
  store = new DynamoDbStore({ table: dynamo.table('lambda'), client: dynamo.client(), clockSkew: 0 })
  await store.migrate()
  // A plain Ledger: the wrappers cap its leases by the invocation themselves.
  ledger = new Ledger({ store, wait: '5s' })
})
afterAll(async () => {
  await dynamo?.stop()
})

/** A Lambda context whose invocation ends `ms` from now. */
function context(ms = 30_000): Context {
  const deadline = Date.now() + ms
  return {
    callbackWaitsForEmptyEventLoop: false,
    functionName: 'orders',
    functionVersion: '$LATEST',
    invokedFunctionArn: 'arn:aws:lambda:us-east-1:123456789012:function:orders',
    memoryLimitInMB: '128',
    awsRequestId: randomUUID(),
    logGroupName: '/aws/lambda/orders',
    logStreamName: '2026/11/23/[$LATEST]abc',
    getRemainingTimeInMillis: () => deadline - Date.now(),
    done: () => {},
    fail: () => {},
    succeed: () => {},
  }
}

function restEvent(key: string | undefined, body: string, principal?: string): APIGatewayProxyEvent {
  const headers: Record<string, string> = { 'Content-Type': 'application/json', Authorization: 'Bearer t0k' }
  if (key !== undefined) headers['Idempotency-Key'] = key
  return {
    resource: '/orders',
    path: '/orders',
    httpMethod: 'POST',
    headers,
    multiValueHeaders: Object.fromEntries(Object.entries(headers).map(([k, v]) => [k, [v]])),
    queryStringParameters: { expand: 'items' },
    multiValueQueryStringParameters: { expand: ['items'] },
    pathParameters: null,
    stageVariables: null,
    body,
    isBase64Encoded: false,
    requestContext: {
      accountId: '123456789012',
      apiId: 'abc123',
      authorizer: principal === undefined ? null : { principalId: principal },
      protocol: 'HTTP/1.1',
      httpMethod: 'POST',
      identity: {
        accessKey: null,
        accountId: null,
        apiKey: null,
        apiKeyId: null,
        caller: null,
        clientCert: null,
        cognitoAuthenticationProvider: null,
        cognitoAuthenticationType: null,
        cognitoIdentityId: null,
        cognitoIdentityPoolId: null,
        principalOrgId: null,
        sourceIp: '203.0.113.7',
        user: null,
        userAgent: 'test',
        userArn: null,
      },
      path: '/prod/orders',
      stage: 'prod',
      requestId: randomUUID(),
      requestTimeEpoch: Date.now(),
      resourceId: 'r1',
      resourcePath: '/orders',
    },
  }
}

function httpApiEvent(
  key: string | undefined,
  body: string,
  options: { sub?: string; functionUrl?: boolean; base64?: boolean; method?: string } = {},
): APIGatewayProxyEventV2 {
  const headers: Record<string, string> = { 'content-type': 'application/json', authorization: 'Bearer t0k' }
  if (key !== undefined) headers['idempotency-key'] = key
  const event = {
    version: '2.0',
    routeKey: options.functionUrl ? '$default' : 'POST /orders',
    rawPath: '/orders',
    rawQueryString: 'expand=items',
    headers,
    cookies: ['session=abc'],
    body: options.base64 ? Buffer.from(body).toString('base64') : body,
    isBase64Encoded: options.base64 === true,
    requestContext: {
      accountId: options.functionUrl ? 'anonymous' : '123456789012',
      apiId: options.functionUrl ? 'urlid' : 'abc123',
      domainName: options.functionUrl ? 'urlid.lambda-url.us-east-1.on.aws' : 'abc123.execute-api.us-east-1.amazonaws.com',
      domainPrefix: options.functionUrl ? 'urlid' : 'abc123',
      http: { method: options.method ?? 'POST', path: '/orders', protocol: 'HTTP/1.1', sourceIp: '203.0.113.7', userAgent: 'test' },
      requestId: randomUUID(),
      routeKey: options.functionUrl ? '$default' : 'POST /orders',
      stage: '$default',
      time: '23/Nov/2026:21:00:00 +0000',
      timeEpoch: Date.now(),
      ...(options.sub === undefined
        ? {}
        : { authorizer: { jwt: { claims: { sub: options.sub }, scopes: [] }, principalId: '', integrationLatency: 0 } }),
    },
  }
  return event as APIGatewayProxyEventV2
}

const created = (body: unknown) => ({
  statusCode: 201,
  headers: { 'content-type': 'application/json', location: '/orders/1' },
  body: JSON.stringify(body),
})

describe('withIdempotency (API Gateway and Function URLs)', () => {
  it('runs 50 concurrent duplicate HTTP API invocations once, and answers each with the same response', async () => {
    let runs = 0
    const handler = withIdempotency(ledger, async (event: APIGatewayProxyEventV2) => {
      runs++
      await new Promise((resolve) => setTimeout(resolve, 100))
      return created({ id: 'ord_1', echo: JSON.parse(event.body ?? 'null') })
    })
    const key = randomUUID()
    const results = await Promise.all(Array.from({ length: 50 }, () => handler(httpApiEvent(key, '{"amount":100}'), context())))
    expect(runs).toBe(1)
    for (const result of results) {
      expect(result).toMatchObject({ statusCode: 201, body: '{"id":"ord_1","echo":{"amount":100}}', isBase64Encoded: false })
    }
    const replayed = results.filter((r) => (r as { headers?: Record<string, string> }).headers?.['idempotent-replayed'] === 'true')
    expect(replayed).toHaveLength(49)
  })

  it('answers 422 with a problem body to a REST API key reused with another payload, without running it', async () => {
    let runs = 0
    const handler = withIdempotency(ledger, async (_event: APIGatewayProxyEvent) => {
      runs++
      return created({ id: 'ord_2' })
    })
    const key = randomUUID()
    expect(await handler(restEvent(key, '{"amount":100}'), context())).toMatchObject({ statusCode: 201 })
    const reused = await handler(restEvent(key, '{"amount":999}'), context())
    expect(runs).toBe(1)
    expect(reused.statusCode).toBe(422)
    expect(reused.headers?.['content-type']).toBe('application/problem+json')
    expect(JSON.parse(reused.body)).toMatchObject({ status: 422, code: 'FINGERPRINT_MISMATCH' })
  })

  it('replays a Function URL binary response byte for byte, marked Idempotent-Replayed', async () => {
    const bytes = Buffer.from(Array.from({ length: 256 }, (_, i) => i))
    const handler = withIdempotency(ledger, async () => ({
      statusCode: 200,
      headers: { 'content-type': 'application/octet-stream' },
      body: bytes.toString('base64'),
      isBase64Encoded: true,
    }))
    const key = randomUUID()
    const first = (await handler(httpApiEvent(key, 'pdf please', { functionUrl: true, base64: true }), context())) as {
      body: string
      headers: Record<string, string>
      isBase64Encoded: boolean
    }
    const again = (await handler(httpApiEvent(key, 'pdf please', { functionUrl: true, base64: true }), context())) as typeof first
    expect(Buffer.from(first.body, 'base64')).toEqual(bytes)
    expect(again.isBase64Encoded).toBe(true)
    expect(Buffer.from(again.body, 'base64')).toEqual(bytes)
    expect(again.headers['idempotent-replayed']).toBe('true')
    expect(first.headers['idempotent-replayed']).toBeUndefined()
  })

  it("scopes keys by the authorizer's principal: one key from two principals runs twice, from one principal once", async () => {
    let runs = 0
    const handler = withIdempotency(ledger, async () => {
      runs++
      return created({ n: runs })
    })
    const key = randomUUID()
    await handler(httpApiEvent(key, '{}', { sub: 'alice' }), context())
    await handler(httpApiEvent(key, '{}', { sub: 'alice' }), context())
    await handler(httpApiEvent(key, '{}', { sub: 'bob' }), context())
    expect(runs).toBe(2)
    const rest = withIdempotency(ledger, async () => {
      runs++
      return created({})
    })
    await rest(restEvent(key, '{}', 'carol'), context())
    await rest(restEvent(key, '{}', 'dave'), context())
    expect(runs).toBe(4)
  })

  it('passes uncovered requests (a GET, a POST without a key) to the handler untouched', async () => {
    const answer = { statusCode: 200, body: 'plain' }
    let runs = 0
    const handler = withIdempotency(ledger, async () => {
      runs++
      return answer
    })
    expect(await handler(httpApiEvent(undefined, '', { method: 'GET' }), context())).toBe(answer)
    expect(await handler(restEvent(undefined, '{}'), context())).toBe(answer)
    expect(runs).toBe(2)
  })

  it('frees the record of an invocation that timed out when the invocation ends, and a retry takes it over', async () => {
    let runs = 0
    let unblock: () => void = () => {}
    const blocked = new Promise<void>((resolve) => {
      unblock = resolve
    })
    const handler = withIdempotency(ledger, async () => {
      runs++
      if (runs === 1) await blocked // the first invocation hangs past its deadline, as a timed-out one does
      return created({ run: runs })
    })
    const key = randomUUID()
    const startedAt = Date.now()
    void handler(httpApiEvent(key, '{}'), context(400))
    await new Promise((resolve) => setTimeout(resolve, 50))
    // The ledger's lease is 30 s; the record is free when the 400 ms invocation is gone.
    const retry = await handler(httpApiEvent(key, '{}'), context())
    expect(retry).toMatchObject({ statusCode: 201, body: '{"run":2}' })
    expect(Date.now() - startedAt).toBeGreaterThanOrEqual(390)
    expect(Date.now() - startedAt).toBeLessThan(5_000)
    unblock()
  })

  it('refuses something that is not a Ledger, saying what it needs', () => {
    expect(() => withIdempotency({} as unknown as Ledger, async () => created({}))).toThrow(/new Ledger\(\{ store \}\)/)
  })

  it('still takes a ledger from lambdaLedger (kept for earlier code): a Ledger with the same options', () => {
    const legacy = lambdaLedger({ store, lease: '7s' })
    expect(legacy).toBeInstanceOf(Ledger)
    expect(legacy.leaseMs).toBe(7_000)
  })

  it('refuses to run without the Lambda context, saying to forward it', async () => {
    const handler = withIdempotency(ledger, async () => created({}))
    await expect(handler(httpApiEvent(randomUUID(), '{}'), undefined as unknown as Context)).rejects.toThrow(/without the Lambda context/)
  })
})

function sqsRecord(
  messageId: string,
  body: string,
  queue = 'arn:aws:sqs:us-east-1:123456789012:orders',
  attributes: Record<string, string> = {},
): SQSRecord {
  return {
    messageId,
    receiptHandle: `handle-${messageId}`,
    body,
    attributes: {
      ApproximateReceiveCount: '1',
      SentTimestamp: String(Date.now()),
      SenderId: 'AIDAEXAMPLE',
      ApproximateFirstReceiveTimestamp: String(Date.now()),
    },
    messageAttributes: Object.fromEntries(Object.entries(attributes).map(([k, v]) => [k, { stringValue: v, dataType: 'String' }])),
    md5OfBody: 'x',
    eventSource: 'aws:sqs',
    eventSourceARN: queue,
    awsRegion: 'us-east-1',
  }
}

describe('sqsBatchHandler', () => {
  it('reports exactly the failed records of a partial batch, and applies each record once across redeliveries', async () => {
    const applied: string[] = []
    let failOnce = true
    const handler = sqsBatchHandler(
      ledger,
      async (record: SQSRecord) => {
        if (record.body === 'b' && failOnce) {
          failOnce = false
          throw new Error('payment gateway timeout')
        }
        applied.push(record.body)
      },
      { onRecordError: () => {} },
    )
    const ids = ['a', 'b', 'c', 'd'].map(() => randomUUID())
    const event: SQSEvent = { Records: ['a', 'b', 'c', 'd'].map((body, i) => sqsRecord(ids[i] as string, body)) }
    expect(await handler(event, context())).toEqual({ batchItemFailures: [{ itemIdentifier: ids[1] }] })
    expect(applied).toEqual(['a', 'c', 'd'])
    // SQS delivers the whole batch again (a visibility timeout, a retried invocation): only "b" runs.
    expect(await handler(event, context())).toEqual({ batchItemFailures: [] })
    expect(applied).toEqual(['a', 'c', 'd', 'b'])
  })

  it('stops a FIFO batch at the first failure and reports it and every later record, unrun', async () => {
    const applied: string[] = []
    const handler = sqsBatchHandler(
      ledger,
      async (record: SQSRecord) => {
        if (record.body === '2') throw new Error('no stock')
        applied.push(record.body)
      },
      { onRecordError: () => {} },
    )
    const ids = ['1', '2', '3', '4'].map(() => randomUUID())
    const fifo = 'arn:aws:sqs:us-east-1:123456789012:orders.fifo'
    const result = await handler({ Records: ['1', '2', '3', '4'].map((body, i) => sqsRecord(ids[i] as string, body, fifo)) }, context())
    expect(result.batchItemFailures.map((f) => f.itemIdentifier)).toEqual(ids.slice(1))
    expect(applied).toEqual(['1'])
  })

  it('keys records by a message attribute when asked, and fails a record that lacks it', async () => {
    const applied: string[] = []
    const errors: unknown[] = []
    const handler = sqsBatchHandler(ledger, async (record: SQSRecord) => void applied.push(record.messageId), {
      key: { attribute: 'orderEventId' },
      onRecordError: (error) => errors.push(error),
    })
    const eventId = randomUUID()
    const [first, resent, keyless] = [randomUUID(), randomUUID(), randomUUID()]
    const result = await handler(
      {
        Records: [
          sqsRecord(first, '{"order":1}', undefined, { orderEventId: eventId }),
          sqsRecord(resent, '{"order":1}', undefined, { orderEventId: eventId }),
          sqsRecord(keyless, '{"order":2}'),
        ],
      },
      context(),
    )
    expect(applied).toEqual([first])
    expect(result).toEqual({ batchItemFailures: [{ itemIdentifier: keyless }] })
    expect(errors).toHaveLength(1)
    expect(isIdempotencyError(errors[0]) && errors[0].code).toBe('KEY_MISSING')
  })

  it('reports a record whose handler ran but whose outcome could not be stored as applied: SQS must not deliver it again to run a second time', async () => {
    // The store takes acquires but not completions (it went away after the effect).
    class LosesCompletions extends MemoryStore {
      override async complete(): Promise<boolean> {
        throw new Error('connection reset')
      }
    }
    const events: string[] = []
    const flaky = new Ledger({ store: new LosesCompletions(), onEvent: (event) => events.push(event.type) })
    let applied = 0
    const errors: unknown[] = []
    const handler = sqsBatchHandler(flaky, async () => void applied++, { onRecordError: (error) => errors.push(error) })
    const result = await handler({ Records: [sqsRecord(randomUUID(), '{"order":1}')] }, context(300))
    expect(applied).toBe(1)
    // Reported failed, SQS would deliver it again once the record's lease (the invocation) ended, and it would run again.
    expect(result).toEqual({ batchItemFailures: [] })
    expect(errors).toEqual([])
    // The ledger reports the lost outcome loudly (its event, metric and log), not the batch.
    expect(events).toContain('unrecorded')
  })

  it('applies a record once whose handler returns a value JSON cannot hold (a BigInt, a circular object): SQS ignores it, so it is not stored', async () => {
    let applied = 0
    const errors: unknown[] = []
    const circular: { self?: unknown } = {}
    circular.self = circular
    const handler = sqsBatchHandler(
      ledger,
      async (record: SQSRecord) => {
        applied++
        return record.body === 'big' ? { rowId: 1n } : circular
      },
      { onRecordError: (error) => errors.push(error) },
    )
    const event: SQSEvent = { Records: [sqsRecord(randomUUID(), 'big'), sqsRecord(randomUUID(), 'circular')] }
    expect(await handler(event, context(1_000))).toEqual({ batchItemFailures: [] })
    expect(errors).toEqual([])
    // Delivered again (SQS is at least once): both are replayed, not applied a second time.
    expect(await handler(event, context())).toEqual({ batchItemFailures: [] })
    expect(applied).toBe(2)
  })

  it('refuses a key that is neither a function nor { attribute } when made (a bare name failed every record with KEY_MISSING)', () => {
    const apply = async () => {}
    for (const key of ['orderEventId', { attribute: '' }, { name: 'orderEventId' }]) {
      expect(() => sqsBatchHandler(ledger, apply, { key: key as never }), JSON.stringify(key)).toThrow(
        expect.objectContaining({
          code: 'INVALID_OPTION',
          message: expect.stringContaining("sqsBatchHandler(): key must be a function (record) => key, or { attribute: 'name' }"),
        }),
      )
    }
    // A string scope is a fixed scope; anything else that is no function is refused too.
    expect(() => sqsBatchHandler(ledger, apply, { scope: 5 as never })).toThrow('scope must be a function or a string')
  })
})

describe('makeIdempotent', () => {
  it('frees the record of an invocation that timed out when the invocation ends, on a plain Ledger', async () => {
    let runs = 0
    let unblock: () => void = () => {}
    const blocked = new Promise<void>((resolve) => {
      unblock = resolve
    })
    const handler = makeIdempotent(
      async (_event: { id: string }) => {
        runs++
        if (runs === 1) await blocked // hangs past its invocation's end, as a timed-out one does
        return { run: runs }
      },
      { ledger, key: (event) => event.id },
    )
    const event = { id: randomUUID() }
    const startedAt = Date.now()
    void handler(event, context(400))
    await new Promise((resolve) => setTimeout(resolve, 50))
    // The ledger's lease is 30 s and it waits up to 5 s: the record is free once the 400 ms invocation is gone.
    expect(await handler({ ...event }, context())).toEqual({ run: 2 })
    expect(Date.now() - startedAt).toBeGreaterThanOrEqual(390)
    expect(Date.now() - startedAt).toBeLessThan(5_000)
    unblock()
  })

  it("keeps the records of two functions apart: one event fanned out to two functions runs in both, neither replays the other's result", async () => {
    // One EventBridge rule, two targets: the same event (same id) reaches a shipping and an email function.
    const event = { id: randomUUID(), detail: { orderId: 'o-7' } }
    const key = (e: typeof event) => e.id
    const ship = makeIdempotent(async () => ({ shipped: true }), { ledger, key, payload: (e) => e.detail })
    const email = makeIdempotent(async () => ({ emailed: true }), { ledger, key, payload: (e) => e.detail })
    const invocation = (functionName: string) => ({ ...context(), functionName })
    expect(await ship(event, invocation('ship-order'))).toEqual({ shipped: true })
    expect(await email(event, invocation('email-receipt'))).toEqual({ emailed: true })
    // Each function's own repeat still replays.
    expect(await email({ ...event }, invocation('email-receipt'))).toEqual({ emailed: true })
  })

  it('runs an event once per key and returns the stored result to repeats', async () => {
    let runs = 0
    const handler = makeIdempotent(
      async (event: { id: string; detail: { orderId: string } }) => {
        runs++
        return { shipped: event.detail.orderId, run: runs }
      },
      { ledger, key: (event) => event.id },
    )
    const event = { id: randomUUID(), detail: { orderId: 'ord_9' } }
    expect(await handler(event, context())).toEqual({ shipped: 'ord_9', run: 1 })
    expect(await handler({ ...event }, context())).toEqual({ shipped: 'ord_9', run: 1 })
    expect(runs).toBe(1)
  })

  it('throws FINGERPRINT_MISMATCH for a key reused with another payload, and KEY_MISSING for an event without a key', async () => {
    const handler = makeIdempotent(async (event: { id?: string; amount: number }) => event.amount, { ledger, key: (event) => event.id })
    const id = randomUUID()
    expect(await handler({ id, amount: 1 }, context())).toBe(1)
    await expect(handler({ id, amount: 2 }, context())).rejects.toMatchObject({ code: 'FINGERPRINT_MISMATCH' })
    // Keyless events never share one record (Powertools stores them all under one hash of null).
    await expect(handler({ amount: 3 }, context())).rejects.toMatchObject({ code: 'KEY_MISSING' })
  })

  it('refuses a bad lease, ttl or wait when the handler is made (at cold start), not at each invocation', async () => {
    const key = (event: { id: string }) => event.id
    for (const bad of [{ lease: 'soon' }, { ttl: -1 }, { wait: '1 fortnight' }] as const) {
      expect(() => makeIdempotent(async () => 1, { ledger, key, ...bad })).toThrow(
        expect.objectContaining({ code: 'INVALID_OPTION', message: expect.stringContaining(Object.keys(bad)[0] as string) }),
      )
    }
    // A scope string is a fixed scope; anything else that is no function was a TypeError at each invocation.
    expect(() => makeIdempotent(async () => 1, { ledger, key, scope: 7 as never })).toThrow(
      'makeIdempotent(): scope must be a function or a string',
    )
    expect(() => makeIdempotent(async () => 1, { ledger, key, payload: 'detail' as never })).toThrow('payload must be a function')
    expect(() => makeIdempotent(async () => 1, { ledger, key, encode: JSON as never })).toThrow(
      'makeIdempotent(): encode must be a function',
    )
    const handler = makeIdempotent(async () => 'ran', { ledger, key, scope: 'orders', lease: '10s', ttl: '1h', wait: '2s' })
    expect(await handler({ id: randomUUID() }, context())).toBe('ran')
  })
})
