/**
 * What a DynamoDB table can lose of idemkey's records (`idemkey doctor dynamodb://…`): DynamoDB itself
 * keeps an acknowledged write in several Availability Zones; what the table adds is global-table
 * replicas (asynchronous across Regions unless multi-Region strong consistency), TTL and point-in-time
 * recovery. Describe calls only.
 */
import { type DurabilityReport, finding, readSetting } from '../../core/durability.js'

/** Sends one Describe request by its name (`DescribeTable`) and returns the answer. */
export type DynamoDbDescribe = (
  operation: 'DescribeTable' | 'DescribeTimeToLive' | 'DescribeContinuousBackups',
  input: { TableName: string },
) => Promise<Record<string, unknown>>

/** Options of {@link dynamoDbDurabilityReport}. */
export interface DynamoDbDurabilityOptions {
  table: string
  /** The store's TTL attribute. @default 'ttl' */
  ttlAttribute?: string
}

/** Reads the table's description and says, per failure, what idemkey's records can lose. */
export async function dynamoDbDurabilityReport(describe: DynamoDbDescribe, options: DynamoDbDurabilityOptions): Promise<DurabilityReport> {
  const unchecked: string[] = []
  const notes: string[] = []
  const TableName = options.table
  const ttlName = options.ttlAttribute ?? 'ttl'
  let table: Record<string, unknown> | undefined
  const status = await readSetting(
    'DescribeTable',
    async () => {
      table = (await describe('DescribeTable', { TableName })).Table as Record<string, unknown> | undefined
      return table === undefined ? undefined : String(table.TableStatus)
    },
    unchecked,
  )
  const ttl = await readSetting(
    'DescribeTimeToLive',
    async () => {
      const answer = (await describe('DescribeTimeToLive', { TableName })).TimeToLiveDescription as
        | { TimeToLiveStatus?: string; AttributeName?: string }
        | undefined
      return answer?.TimeToLiveStatus === undefined
        ? undefined
        : `${answer.TimeToLiveStatus}${answer.AttributeName ? ` on ${answer.AttributeName}` : ''}`
    },
    unchecked,
  )
  const pitr = await readSetting(
    'DescribeContinuousBackups',
    async () => {
      const answer = (await describe('DescribeContinuousBackups', { TableName })).ContinuousBackupsDescription as
        | { PointInTimeRecoveryDescription?: { PointInTimeRecoveryStatus?: string } }
        | undefined
      return answer?.PointInTimeRecoveryDescription?.PointInTimeRecoveryStatus
    },
    unchecked,
  )
  if (ttl.ok && ttl.value !== `ENABLED on ${ttlName}`) {
    notes.push(
      `TTL is ${ttl.value}: expired records are never deleted and the table only grows (UpdateTimeToLive on ${ttlName}; idemkey migrate does it)`,
    )
  }
  if (pitr.ok && pitr.value !== 'ENABLED') {
    notes.push(
      'point-in-time recovery is off: a table deleted or overwritten by mistake cannot be restored (UpdateContinuousBackups PointInTimeRecoveryEnabled=true)',
    )
  }
  const evidence = [...(status.ok ? [`TableStatus=${status.value}`] : [])]
  const extra = [...(ttl.ok ? [`ttl=${ttl.value}`] : []), ...(pitr.ok ? [`pitr=${pitr.value}`] : [])]
  if (!status.ok) {
    const reason = `not checked: ${status.reason}`
    return {
      store: 'dynamodb',
      findings: [
        finding('process-crash', 'unchecked', reason),
        finding('machine-crash', 'unchecked', reason),
        finding('failover', 'unchecked', reason),
        finding('eviction', 'n/a', 'DynamoDB never evicts items'),
        finding('expiry', 'safe', 'records are read as expired only after their ttl, whatever TTL deletes', '', extra),
      ],
      unchecked,
      notes,
    }
  }
  const replicas = (table?.Replicas as unknown[] | undefined) ?? []
  const strong = table?.MultiRegionConsistency === 'STRONG'
  const managed = 'nothing: DynamoDB acknowledges a write once it is stored durably in several Availability Zones'
  const findings = [
    finding('process-crash', 'safe', managed, '', evidence),
    finding('machine-crash', 'safe', managed, '', evidence),
    replicas.length === 0 || strong
      ? finding(
          'failover',
          'safe',
          replicas.length === 0
            ? 'nothing: within a Region, DynamoDB fails over between Availability Zones with the data'
            : 'nothing: multi-Region strong consistency',
          '',
          [...evidence, `replicas=${replicas.length}`],
        )
      : finding(
          'failover',
          'loses',
          'the writes not yet replicated when traffic moves to another Region: global tables replicate asynchronously (last writer wins)',
          'a global table with MultiRegionConsistency STRONG, or one Region for idemkey',
          [...evidence, `replicas=${replicas.length}`],
        ),
    finding('eviction', 'n/a', 'DynamoDB never evicts items', '', []),
    finding('expiry', 'safe', 'records are read as expired only after their ttl; TTL deletes them some time later', '', extra),
  ]
  return { store: 'dynamodb', server: 'Amazon DynamoDB API', findings, unchecked, notes }
}
