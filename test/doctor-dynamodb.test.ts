/**
 * `idemkey doctor dynamodb://…` on an in-process dynalite (or IDEMKEY_DYNAMODB_ENDPOINT): what DynamoDB
 * itself guarantees, the TTL it reads, and what it cannot read (dynalite has no point-in-time recovery
 * API), named; a missing table and an endpoint that does not answer are unchecked, exit 3.
 */
import { CreateTableCommand } from '@aws-sdk/client-dynamodb'
import { type DoctorResult, runDoctor } from '../src/cli/commands/doctor.js'
import { type DynamoDbEndpoint, startDynamoDb } from './helpers/dynalite.js'
import { freePort } from './helpers/services.js'

const verdicts = (result: DoctorResult) => Object.fromEntries(result.report.findings.map((f) => [f.failure, f.verdict]))

describe('idemkey doctor on DynamoDB', () => {
  let dynamo: DynamoDbEndpoint
  const saved = { id: process.env.AWS_ACCESS_KEY_ID, secret: process.env.AWS_SECRET_ACCESS_KEY }
  beforeAll(async () => {
    dynamo = await startDynamoDb()
    // The doctor makes its own client from the URL: dynalite takes any credentials.
    process.env.AWS_ACCESS_KEY_ID ??= 'test'
    process.env.AWS_SECRET_ACCESS_KEY ??= 'test'
  })
  afterAll(async () => {
    await dynamo?.stop()
    if (saved.id === undefined) delete process.env.AWS_ACCESS_KEY_ID
    if (saved.secret === undefined) delete process.env.AWS_SECRET_ACCESS_KEY
  })
  const url = (table: string) =>
    `dynamodb://${table}?region=us-east-1${dynamo.endpoint ? `&endpoint=${encodeURIComponent(dynamo.endpoint)}` : ''}`

  it('a table in one Region loses nothing to a crash or failover; what the emulator cannot answer is named, TTL off is a note', async () => {
    const table = dynamo.table('doctor')
    await dynamo.client().send(
      new CreateTableCommand({
        TableName: table,
        AttributeDefinitions: [{ AttributeName: 'pk', AttributeType: 'S' }],
        KeySchema: [{ AttributeName: 'pk', KeyType: 'HASH' }],
        BillingMode: 'PAY_PER_REQUEST',
      }),
    )
    const result = await runDoctor(url(table))
    expect(verdicts(result)).toEqual({
      'process-crash': 'safe',
      'machine-crash': 'safe',
      failover: 'safe',
      eviction: 'n/a',
      expiry: 'safe',
    })
    expect(result.report.findings.find((f) => f.failure === 'failover')?.evidence).toEqual(['TableStatus=ACTIVE', 'replicas=0'])
    expect(result.report.notes[0]).toMatch(/^TTL is DISABLED: expired records are never deleted/)
    if (dynamo.endpoint?.startsWith('http://127.0.0.1')) {
      // dynalite has no DescribeContinuousBackups: named, and the SAFE line says no row depends on it.
      expect(result.report.unchecked).toEqual([expect.stringMatching(/^DescribeContinuousBackups: /)])
      expect(result.text).toMatch(
        /SAFE: no single failure loses an acknowledged record\. Not checked, and no row depends on it: DescribeContinuousBackups: /,
      )
    }
    expect(result.exitCode).toBe(0)
    expect(result.json).toMatchObject({ store: 'dynamodb', status: 'safe', exitCode: 0 })
  })

  it('a table that does not exist: the rows that depend on it are unchecked, exit 3', async () => {
    const result = await runDoctor(url(dynamo.table('absent')))
    expect(verdicts(result)).toMatchObject({ 'process-crash': 'unchecked', 'machine-crash': 'unchecked', failover: 'unchecked' })
    expect(result.report.unchecked[0]).toMatch(/^DescribeTable: .*(not found|non-existent)/i)
    expect(result.exitCode).toBe(3)
  })

  it('an endpoint nothing listens on: every row unchecked, exit 3', async () => {
    const port = await freePort()
    const result = await runDoctor(`dynamodb://t?region=us-east-1&endpoint=${encodeURIComponent(`http://127.0.0.1:${port}`)}`, {
      timeout: 2_000,
    })
    expect(new Set(Object.values(verdicts(result)))).toEqual(new Set(['unchecked']))
    expect(result.report.unchecked[0]).toMatch(/^the server: could not reach the server/)
    expect(result.exitCode).toBe(3)
  })
})
