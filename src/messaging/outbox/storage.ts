/**
 * The contract between the relay and an outbox table (PostgreSQL or SQLite), and how `add()`
 * turns its input into a row: payload bytes, message ID, size limit.
 */
import { randomUUID } from 'node:crypto'
import { deriveKey } from '../../core/derive-key.js'
import { IdempotencyError } from '../../errors.js'
import type { MessageHeaders, OutboxMessage } from '../message.js'

/** A failed row: when to try again, or dead-letter it. */
export interface RowFailure {
  seq: number
  error: string
  /** Delay before the next attempt; ignored when `dead`. */
  retryInMs: number
  dead: boolean
}

/**
 * What the relay needs from an outbox table. Every method is one atomic step.
 * `claim` leases up to `limit` publishable rows to `relayId` for `leaseMs` and counts an attempt;
 * a row whose lease ends without `markSent`/`markFailed`/`release` is claimable again.
 */
export interface RelayStorage {
  claim(relayId: string, limit: number, leaseMs: number): Promise<OutboxMessage[]>
  /** Marks rows sent. Whoever holds the lease: the broker confirmed them, so they are sent. */
  markSent(seqs: readonly number[]): Promise<void>
  markFailed(relayId: string, failures: readonly RowFailure[]): Promise<void>
  /** Gives rows back without counting the attempt (a partition was held back behind a failure). */
  release(relayId: string, seqs: readonly number[]): Promise<void>
  /** Calls `wake` when new rows are committed (LISTEN/NOTIFY); returns how to stop. Optional. */
  listen?(wake: () => void): Promise<() => Promise<void>>
}

/** The input of `outbox.add()`. */
export interface OutboxEventInput {
  /** Subject, routing key or stream the event goes to. */
  topic: string
  /** Any JSON-serializable value, or raw bytes as a `Uint8Array`. */
  payload: unknown
  headers?: MessageHeaders
  /** Explicit message ID. Wins over `idempotencyKey`. */
  id?: string
  /**
   * The idempotency key of the request that caused the event: the message ID is then
   * `deriveKey(idempotencyKey, "outbox:<topic>:<n>")`, so a replayed request adds no second event.
   */
  idempotencyKey?: string
  /** Which event of this topic for this request (0, 1, 2…), when a request adds several. @default 0 */
  n?: number
  /** Events with the same partition key are published in the order they were added. */
  partitionKey?: string
}

/** The result of `outbox.add()`. */
export interface AddResult {
  id: string
  /** `false` when a row with this ID already existed (a replay): nothing was added. */
  created: boolean
}

/** A row ready to insert. */
export interface EncodedEvent {
  id: string
  topic: string
  payload: Buffer
  contentType: string
  headers: string
  partitionKey: string | null
}

/** Default largest payload: 1 MiB, NATS's default `max_payload`. */
export const DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024

/** The message ID `add()` uses: explicit `id`, else derived from the request's key, else a random UUID. */
export function messageIdFor(input: Pick<OutboxEventInput, 'id' | 'idempotencyKey' | 'topic' | 'n'>): string {
  if (input.id !== undefined) {
    if (typeof input.id !== 'string' || input.id.length === 0 || input.id.length > 255) {
      throw new IdempotencyError(
        'INVALID_ARGUMENT',
        `outbox.add: id must be a string of 1-255 characters, got ${JSON.stringify(input.id)}.`,
      )
    }
    return input.id
  }
  if (input.idempotencyKey !== undefined) {
    const n = input.n ?? 0
    if (!Number.isSafeInteger(n) || n < 0) {
      throw new IdempotencyError('INVALID_ARGUMENT', `outbox.add: n must be a non-negative integer, got ${String(n)}.`)
    }
    return deriveKey(input.idempotencyKey, `outbox:${input.topic}:${n}`)
  }
  return randomUUID()
}

/** Validates and serializes an event. Throws `INVALID_ARGUMENT` or `BODY_TOO_LARGE`; touches no database. */
export function encodeEvent(input: OutboxEventInput, maxPayloadBytes: number): EncodedEvent {
  if (typeof input !== 'object' || input === null) {
    throw new IdempotencyError('INVALID_ARGUMENT', 'outbox.add needs an event: { topic, payload, headers?, id?, idempotencyKey? }.')
  }
  if (typeof input.topic !== 'string' || input.topic.length === 0 || input.topic.length > 255) {
    throw new IdempotencyError(
      'INVALID_ARGUMENT',
      `outbox.add: topic must be a string of 1-255 characters, got ${JSON.stringify(input.topic)}.`,
    )
  }
  let payload: Buffer
  let contentType: string
  if (input.payload instanceof Uint8Array) {
    payload = Buffer.from(input.payload)
    contentType = 'application/octet-stream'
  } else {
    let text: string | undefined
    try {
      text = JSON.stringify(input.payload)
    } catch (cause) {
      throw new IdempotencyError(
        'INVALID_ARGUMENT',
        `outbox.add: the payload of "${input.topic}" cannot be serialized as JSON (${cause instanceof Error ? cause.message : String(cause)}). ` +
          'Pass plain data (no BigInt, no cycles) or a Uint8Array. Nothing was written.',
        { cause },
      )
    }
    if (text === undefined) {
      throw new IdempotencyError(
        'INVALID_ARGUMENT',
        `outbox.add: the payload of "${input.topic}" is ${typeof input.payload}, which JSON cannot represent. Nothing was written.`,
      )
    }
    payload = Buffer.from(text, 'utf8')
    contentType = 'application/json'
  }
  if (payload.byteLength > maxPayloadBytes) {
    throw new IdempotencyError(
      'BODY_TOO_LARGE',
      `outbox.add: the payload of "${input.topic}" is ${payload.byteLength} bytes, over the limit of ${maxPayloadBytes}. ` +
        'Store large data elsewhere and send a reference, or raise maxPayloadBytes (and the broker limit). Nothing was written.',
    )
  }
  const headers = input.headers ?? {}
  for (const [name, value] of Object.entries(headers)) {
    if (typeof value !== 'string') {
      throw new IdempotencyError('INVALID_ARGUMENT', `outbox.add: header "${name}" must be a string, got ${typeof value}.`)
    }
  }
  if (input.partitionKey !== undefined && (typeof input.partitionKey !== 'string' || input.partitionKey.length === 0)) {
    throw new IdempotencyError('INVALID_ARGUMENT', 'outbox.add: partitionKey must be a non-empty string when given.')
  }
  return {
    id: messageIdFor(input),
    topic: input.topic,
    payload,
    contentType,
    headers: JSON.stringify(headers),
    partitionKey: input.partitionKey ?? null,
  }
}
