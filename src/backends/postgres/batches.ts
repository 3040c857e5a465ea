/**
 * PostgresStore's operations as batch kinds for group commit: the arrays each batch statement takes,
 * and each caller's answer read back from its rows. Not part of the public API.
 */
import type { AcquireResult, StoredRecord } from '../../core/store.js'
import { IdempotencyError } from '../../errors.js'
import { type BatchAnswer, type BatchKind, GroupCommit } from '../group-commit.js'
import { causes } from '../records.js'
import type { BatchStatements } from './batch-statements.js'
import type { PgQueryResult } from './pool.js'
import { rowHeld } from './postgres-errors.js'
import { type AcquireRow, acquireAnswer, type Row, toRecord } from './rows.js'
import type { Statement } from './statements.js'

export interface AcquireInput {
  scope: string
  key: string
  fingerprint: string
  leaseMs: number
  /** Whether this process already watches the key (the row is then flagged for a NOTIFY at once). */
  watched: boolean
}

export interface FencedInput {
  scope: string
  key: string
  token: number
}

export interface RenewInput extends FencedInput {
  leaseMs: number
}

export interface CompleteInput extends FencedInput {
  status: string
  responseStatus: number
  /** JSON text (encodeHeaders). */
  headers: string
  body: Buffer
  resourceId: string | null
  ttlMs: number
}

export interface KeyInput {
  scope: string
  key: string
}

/** What the batches need of the store: its single-statement operations, and a query on the pool. */
export interface BatchContext {
  sql: BatchStatements
  retentionMs: number
  channel: string | null
  /** The pool path of the store: errors come back as the store's typed errors for `operation`. */
  query(operation: string, statement: Statement, values: unknown[]): Promise<PgQueryResult>
  one: {
    acquire(input: AcquireInput): Promise<AcquireResult>
    get(input: KeyInput): Promise<StoredRecord | null>
    renew(input: RenewInput): Promise<boolean>
    complete(input: CompleteInput): Promise<boolean>
    release(input: FencedInput): Promise<boolean>
  }
}

/** The row a caller touches, as a string that sorts the same in every process. Scopes hold no control characters. */
function identity(input: KeyInput): string {
  return `${input.scope}\u0000${input.key}`
}

/** A deadlock between two processes' batches: rolled back whole, and single statements (one row each) cannot meet it. */
function deadlock(error: unknown): boolean {
  return causes(error).some((cause) => (cause as { code?: unknown }).code === '40P01')
}

/**
 * An acquire batch that met a row another transaction holds (its lock wait bound, statements.ts
 * `ACQUIRE_NOW`) wrote nothing: its callers run alone, where only the held key's caller meets the lock
 * (and answers `in_progress`).
 */
function deadlockOrHeld(error: unknown): boolean {
  return deadlock(error) || rowHeld(error)
}

export function lostRaces(input: KeyInput): Error {
  return new IdempotencyError(
    'STORE_UNAVAILABLE',
    `postgres: acquire of ${JSON.stringify(input.key)} lost 100 races in a row to writers that kept changing it. Retry later.`,
  )
}

/** The callers (1-based `n`) a batch statement returned a row for. */
function answered(result: PgQueryResult): Set<number> {
  return new Set(result.rows.map((row) => Number((row as { n: string | number }).n)))
}

/** Fenced writes answer true when their row came back. */
function fencedKind<I extends FencedInput>(
  one: (input: I) => Promise<boolean>,
  many: (inputs: I[]) => Promise<PgQueryResult>,
): BatchKind<I, boolean> {
  return {
    one,
    async many(inputs) {
      const done = answered(await many(inputs))
      return inputs.map((_, i) => ({ value: done.has(i + 1) }))
    },
    identity,
    distinct: true,
    gaveUp: lostRaces,
    alone: deadlock,
  }
}

export function groupCommits(ctx: BatchContext) {
  const column = <I, V>(inputs: I[], pick: (input: I) => V) => inputs.map(pick)
  const keys = (inputs: KeyInput[]) => [column(inputs, (i) => i.scope), column(inputs, (i) => i.key)]
  return {
    acquire: new GroupCommit<AcquireInput, AcquireResult>({
      one: ctx.one.acquire,
      async many(inputs) {
        const first = inputs.map((input, i) => i === 0 || identity(input) !== identity(inputs[i - 1] as AcquireInput))
        const values = [
          ...keys(inputs),
          column(inputs, (i) => i.fingerprint),
          column(inputs, (i) => i.leaseMs),
          column(inputs, (i) => (i.watched ? 't' : 'f')),
          first.map((flag) => (flag ? 't' : 'f')),
          ctx.retentionMs,
        ]
        const rows = (await ctx.query('acquire', ctx.sql.acquire, values)).rows as Array<AcquireRow & { n: string | number }>
        const answers: Array<BatchAnswer<AcquireResult>> = inputs.map(() => ({ again: true }))
        for (const row of rows) {
          const i = Number(row.n) - 1
          const input = inputs[i] as AcquireInput
          const answer = acquireAnswer(row, input.scope, input.key, input.fingerprint)
          if (answer) answers[i] = { value: answer }
        }
        return answers
      },
      identity,
      distinct: false,
      gaveUp: lostRaces,
      alone: deadlockOrHeld,
    }),
    get: new GroupCommit<KeyInput, StoredRecord | null>({
      one: ctx.one.get,
      async many(inputs) {
        const rows = (await ctx.query('get', ctx.sql.get, keys(inputs))).rows as Array<Row & { n: string | number }>
        const answers: Array<BatchAnswer<StoredRecord | null>> = inputs.map(() => ({ value: null }))
        for (const row of rows) answers[Number(row.n) - 1] = { value: toRecord(row) }
        return answers
      },
      identity,
      distinct: false,
      gaveUp: lostRaces,
      alone: deadlock,
    }),
    renew: new GroupCommit<RenewInput, boolean>(
      fencedKind(ctx.one.renew, (inputs) =>
        ctx.query('renew', ctx.sql.renew, [
          ...keys(inputs),
          column(inputs, (i) => i.token),
          column(inputs, (i) => i.leaseMs),
          ctx.retentionMs,
        ]),
      ),
    ),
    complete: new GroupCommit<CompleteInput, boolean>(
      fencedKind(ctx.one.complete, (inputs) =>
        ctx.query('complete', ctx.sql.complete, [
          ...keys(inputs),
          column(inputs, (i) => i.token),
          column(inputs, (i) => i.status),
          column(inputs, (i) => i.responseStatus),
          column(inputs, (i) => i.headers),
          column(inputs, (i) => i.body.toString('hex')),
          column(inputs, (i) => i.resourceId),
          column(inputs, (i) => i.ttlMs),
          ctx.channel,
        ]),
      ),
    ),
    release: new GroupCommit<FencedInput, boolean>(
      fencedKind(ctx.one.release, (inputs) =>
        ctx.query('release', ctx.sql.release, [...keys(inputs), column(inputs, (i) => i.token), ctx.retentionMs, ctx.channel]),
      ),
    ),
  }
}

export type GroupCommits = ReturnType<typeof groupCommits>
