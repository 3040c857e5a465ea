/**
 * MySqlStore's operations as batch kinds for group commit (the scheduler is the one PostgresStore
 * uses: no timer, a caller alone sends the single statement). Not part of the public API.
 */
import { randomBytes } from 'node:crypto'
import { stepsFromJson } from '../../core/steps-store.js'
import type { AcquireResult, StoredRecord } from '../../core/store.js'
import { IdempotencyError } from '../../errors.js'
import { type BatchAnswer, type BatchKind, GroupCommit } from '../group-commit.js'
import { causes } from '../records.js'
import type { BatchStatements } from './batch-statements.js'
import { isRetryable, nowaitRefused } from './mysql-errors.js'
import type { MySqlConnectionLike, MySqlValue, WriteResult } from './pool.js'
import { liveAnswer, type Row, toRecord } from './records.js'

/** Scope and key as the bytes the table holds. */
export interface KeyInput {
  scope: Buffer
  key: Buffer
}

export interface AcquireInput extends KeyInput {
  fingerprint: string
  leaseMs: number
}

/** The values of a fenced single statement (renew, complete, release): identity, token and the rest by name. */
export type FencedInput = KeyInput & { token: MySqlValue } & Record<string, MySqlValue>

/** What the batches need of the store. */
export interface BatchContext {
  sql: BatchStatements
  /** One text-protocol statement on the pool, no retry; errors come back as the store's typed errors for `operation`. */
  query(operation: string, sql: string, values: MySqlValue[]): Promise<unknown>
  /** Runs `fn` in a transaction on one pool connection (rolled back when it throws); errors typed as `query`'s. */
  transaction<R>(operation: string, fn: (connection: MySqlConnectionLike) => Promise<R>): Promise<R>
  one: {
    acquire(input: AcquireInput): Promise<AcquireResult>
    get(input: KeyInput): Promise<StoredRecord | null>
    renew(input: FencedInput): Promise<boolean>
    complete(input: FencedInput): Promise<boolean>
    release(input: FencedInput): Promise<boolean>
  }
}

/**
 * The row an input touches, as a string that sorts as the primary key (scope, key) does: bytes in
 * hex, and a space (below every hex digit) between scope and key. Batches lock rows in this order.
 */
function identity(input: KeyInput): string {
  return `${input.scope.toString('hex')} ${input.key.toString('hex')}`
}

const rowIdentity = (row: { scope: Buffer; key: Buffer }) => identity(row)

/**
 * A batch that deadlocked with another transaction (1213), or waited too long for a lock (1205):
 * the server rolled it back, nothing was written, and the single statements (which retry these) answer.
 * So does a batch whose UPDATE changed other rows than its locks promised (never expected).
 */
function alone(error: unknown): boolean {
  return causes(error).some((cause) => isRetryable(cause) || nowaitRefused(cause) || cause instanceof Drift)
}

class Drift extends Error {}

export function lostRaces(key: Buffer | string): Error {
  return new IdempotencyError(
    'STORE_UNAVAILABLE',
    `mysql: acquire of ${JSON.stringify(typeof key === 'string' ? key : key.toString('latin1'))} lost 100 races in a row to writers that kept releasing or evicting it. Retry later.`,
  )
}

const keyValues = (inputs: KeyInput[]) => inputs.flatMap((input) => [input.scope, input.key])

/** Each caller's row of `rows`, by identity. */
function byIdentity<R extends { scope: Buffer; key: Buffer }>(rows: R[]): Map<string, R> {
  return new Map(rows.map((row) => [rowIdentity(row), row]))
}

/** Distinct identities of inputs (sorted ones: duplicates are neighbours). */
function distinct<I extends KeyInput>(inputs: I[]): I[] {
  return inputs.filter((input, i) => i === 0 || identity(input) !== identity(inputs[i - 1] as I))
}

/**
 * Most bytes of values (body, headers, resource id) a caller may bring to a batch: 256 callers then
 * make a statement of at most 4 MiB (8 MiB as the hex the text protocol sends), inside the smallest
 * default `max_allowed_packet` (16 MiB, MariaDB). A larger complete sends its single statement.
 */
export const MAX_BATCHED_BYTES = 16 * 1024

/** Whether a fenced write is small enough to share a batch statement. */
export function fitsBatch(input: FencedInput): boolean {
  let bytes = 0
  for (const value of Object.values(input)) if (typeof value === 'string' || Buffer.isBuffer(value)) bytes += value.length
  return bytes <= MAX_BATCHED_BYTES
}

/**
 * A fenced write for many callers of distinct rows, in one transaction: lock their rows in primary-key
 * order (`SELECT … FOR UPDATE`), keep the callers whose token is current on an in-progress row (what
 * the single UPDATE's WHERE asks), update those in one joined UPDATE, commit. Under the locks nothing
 * can change in between, so the callers kept are exactly the ones whose single statement would have
 * changed the row.
 */
function fencedKind(ctx: BatchContext, operation: 'renew' | 'complete' | 'release', columns: string[]): BatchKind<FencedInput, boolean> {
  const statement = ctx.sql[operation]
  return {
    one: ctx.one[operation],
    async many(inputs) {
      const done = new Set<FencedInput>()
      await ctx.transaction(operation, async (connection) => {
        const [locked] = await connection.query(ctx.sql.lock(inputs.length), keyValues(inputs))
        const rows = byIdentity(locked as Array<{ scope: Buffer; key: Buffer; token: number | string; status: string }>)
        const current = inputs.filter((input) => {
          const row = rows.get(identity(input))
          return row !== undefined && row.status === 'in_progress' && Number(row.token) === input.token
        })
        if (current.length === 0) return
        const values = current.flatMap((input) => [
          input.scope,
          input.key,
          input.token,
          ...columns.map((name) => input[name] as MySqlValue),
        ])
        const [result] = await connection.query(statement(current.length), values)
        if ((result as WriteResult).affectedRows !== current.length) {
          throw new Drift(`mysql: a batched ${operation} changed ${(result as WriteResult).affectedRows} rows of ${current.length} locked`)
        }
        for (const input of current) done.add(input)
      })
      return inputs.map((input) => ({ value: done.has(input) }))
    },
    identity,
    distinct: true,
    gaveUp: (input) => lostRaces(input.key),
    alone,
  }
}

export function groupCommits(ctx: BatchContext) {
  return {
    acquire: new GroupCommit<AcquireInput, AcquireResult>({
      one: ctx.one.acquire,
      /**
       * One read of every caller's record (a live one answers, as the single acquire's first read);
       * then, for the first caller of each row left, one multi-row upsert (one commit) and one read
       * back. A caller holds its row when the row carries its claim; otherwise the record read back
       * answers it, or it goes again in the next batch (its row changed in between, or another
       * caller of the batch wrote it first), as the single acquire goes round again.
       */
      async many(inputs) {
        const answers: Array<BatchAnswer<AcquireResult>> = inputs.map(() => ({ again: true }))
        const keys = distinct(inputs)
        const seen = byIdentity((await ctx.query('acquire', ctx.sql.peek(keys.length), keyValues(keys))) as Row[])
        const writers: Array<{ i: number; claim: Buffer }> = []
        const writing = new Set<string>()
        for (const [i, input] of inputs.entries()) {
          const id = identity(input)
          const row = seen.get(id)
          const answer = row && liveAnswer(row, input.fingerprint)
          if (answer) answers[i] = { value: answer }
          else if (!writing.has(id)) {
            writing.add(id)
            writers.push({ i, claim: randomBytes(16) })
          }
        }
        if (writers.length === 0) return answers
        const offers = writers.map(({ i, claim }) => ({ input: inputs[i] as AcquireInput, claim }))
        // Takeovers first ask whether another transaction holds their rows (statements.ts, `held`): the
        // upsert would wait for it, and the whole batch with it. One held row fails this read at once,
        // and the batch's callers run alone, where only that row's caller meets it.
        const takeovers = offers.filter(({ input }) => seen.has(identity(input))).map(({ input }) => input)
        if (takeovers.length > 0) await ctx.query('acquire', ctx.sql.held(takeovers.length), keyValues(takeovers))
        await ctx.query(
          'acquire',
          ctx.sql.acquire(offers.length),
          offers.flatMap(({ input, claim }) => [input.scope, input.key, input.fingerprint, input.leaseMs, input.leaseMs, claim]),
        )
        const after = byIdentity(
          (await ctx.query('acquire', ctx.sql.acquired(offers.length), keyValues(offers.map(({ input }) => input)))) as Array<
            Row & { claim: Buffer }
          >,
        )
        for (const [w, { input, claim }] of offers.entries()) {
          const row = after.get(identity(input))
          if (row === undefined) continue
          const i = (writers[w] as { i: number }).i
          if (claim.equals(row.claim)) {
            const steps = stepsFromJson(row.steps)
            answers[i] = {
              value: steps ? { kind: 'acquired', token: Number(row.token), steps } : { kind: 'acquired', token: Number(row.token) },
            }
            continue
          }
          const answer = liveAnswer(row, input.fingerprint)
          if (answer) answers[i] = { value: answer }
        }
        return answers
      },
      identity,
      distinct: false,
      gaveUp: (input) => lostRaces(input.key),
      alone,
    }),
    get: new GroupCommit<KeyInput, StoredRecord | null>({
      one: ctx.one.get,
      async many(inputs) {
        const keys = distinct(inputs)
        const rows = byIdentity((await ctx.query('get', ctx.sql.get(keys.length), keyValues(keys))) as Row[])
        return inputs.map((input) => {
          const row = rows.get(identity(input))
          return { value: row ? toRecord(row) : null }
        })
      },
      identity,
      distinct: false,
      gaveUp: (input) => lostRaces(input.key),
      alone,
    }),
    renew: new GroupCommit(fencedKind(ctx, 'renew', ['lease'])),
    complete: new GroupCommit(
      fencedKind(ctx, 'complete', ['status', 'response_status', 'response_headers', 'response_body', 'resource_id', 'ttl']),
    ),
    release: new GroupCommit(fencedKind(ctx, 'release', [])),
  }
}

export type GroupCommits = ReturnType<typeof groupCommits>
