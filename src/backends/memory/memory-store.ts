import { assertClock, type Clock, systemClock } from '../../core/clock.js'
import { type Duration, parseDuration } from '../../core/duration.js'
import { applyStep } from '../../core/steps.js'
import { assertRecordStep } from '../../core/steps-store.js'
import {
  type AcquireResult,
  DEFAULT_ABANDONED_RETENTION_MS,
  type IdempotencyStore,
  type ListFilter,
  type Outcome,
  type StepEntry,
  type StoredRecord,
  type Unsubscribe,
} from '../../core/store.js'
import { assertFingerprint, assertIdentity, assertPositiveInteger } from '../../core/validate.js'
import { assertOutcome, copyRecord, copyResponse, listLimit, matchesFilter } from '../records.js'

/** Options of {@link MemoryStore}. */
export interface MemoryStoreOptions {
  /** Give it the ledger's clock in tests. @default systemClock */
  clock?: Clock
  /** How long a record whose lease ended is kept before it may be purged. @default '24h' */
  abandonedRetention?: Duration
}

/**
 * Records in this process's memory: for tests and single-process use. Everything is lost when the
 * process exits; use SqliteStore (one machine) or PostgresStore/RedisStore (many) for real work.
 *
 * @example const ledger = new Ledger({ store: new MemoryStore() })
 */
export class MemoryStore implements IdempotencyStore {
  readonly name = 'memory'
  readonly serverClock = false
  readonly #clock: Clock
  readonly #abandonedRetentionMs: number
  /** scope → key → record: no string building on the hot path. */
  readonly #records = new Map<string, Map<string, StoredRecord>>()
  readonly #watchers = new Map<string, Set<() => void>>()
  /** Each record's steps: a fresh record is a new object, so its predecessor's steps go with the old one. */
  readonly #steps = new WeakMap<StoredRecord, Map<string, string | null>>()

  constructor(options: MemoryStoreOptions = {}) {
    assertClock('new MemoryStore()', 'clock', options.clock)
    this.#clock = options.clock ?? systemClock
    this.#abandonedRetentionMs = parseDuration(options.abandonedRetention ?? DEFAULT_ABANDONED_RETENTION_MS, 'abandonedRetention')
  }

  async acquire(scope: string, key: string, fingerprint: string, leaseMs: number): Promise<AcquireResult> {
    assertIdentity(scope, key)
    assertFingerprint(fingerprint)
    assertPositiveInteger(leaseMs, 'leaseMs')
    let records = this.#records.get(scope)
    if (records === undefined) {
      records = new Map()
      this.#records.set(scope, records)
    }
    const now = this.#clock.now()
    const record = records.get(key)
    const lockedUntilMs = now + leaseMs
    if (record === undefined || record.expiresAtMs <= now) {
      records.set(key, {
        scope,
        key,
        fingerprint,
        status: 'in_progress',
        token: (record?.token ?? 0) + 1,
        lockedUntilMs,
        response: null,
        resourceId: null,
        attempts: 1,
        createdAtMs: now,
        updatedAtMs: now,
        expiresAtMs: lockedUntilMs + this.#abandonedRetentionMs,
      })
      return { kind: 'acquired', token: (record?.token ?? 0) + 1 }
    }
    const live = record.status !== 'in_progress' || (record.lockedUntilMs as number) > now
    if (live) {
      if (record.fingerprint !== fingerprint) return { kind: 'mismatch' }
      if (record.status === 'in_progress') return { kind: 'in_progress', lockedUntilMs: record.lockedUntilMs as number }
      return { kind: 'replay', record: copyRecord(record) }
    }
    // Takeover: the holder's lease ended (it crashed, or released a transient failure). Another request
    // (another fingerprint) may take it only if the ended attempt left no steps: those are its request's
    // partial effects, never to be handed to a different one.
    const steps = this.#steps.get(record)
    if (record.fingerprint !== fingerprint && steps !== undefined && steps.size > 0) return { kind: 'mismatch' }
    record.fingerprint = fingerprint
    record.token += 1
    record.attempts += 1
    record.lockedUntilMs = lockedUntilMs
    record.updatedAtMs = now
    record.expiresAtMs = lockedUntilMs + this.#abandonedRetentionMs
    if (steps === undefined) return { kind: 'acquired', token: record.token }
    return { kind: 'acquired', token: record.token, steps: [...steps].map(([name, result]): StepEntry => ({ name, result })) }
  }

  async renew(scope: string, key: string, token: number, leaseMs: number): Promise<boolean> {
    assertIdentity(scope, key)
    assertPositiveInteger(leaseMs, 'leaseMs')
    const record = this.#held(scope, key, token)
    if (!record) return false
    const now = this.#clock.now()
    record.lockedUntilMs = now + leaseMs
    record.updatedAtMs = now
    record.expiresAtMs = record.lockedUntilMs + this.#abandonedRetentionMs
    return true
  }

  async complete(scope: string, key: string, token: number, outcome: Outcome, ttlMs: number): Promise<boolean> {
    assertIdentity(scope, key)
    assertPositiveInteger(ttlMs, 'ttlMs')
    const record = this.#held(scope, key, token)
    if (!record) return false
    const now = this.#clock.now()
    assertOutcome(outcome)
    record.status = outcome.status
    record.response = copyResponse(outcome.response)
    record.resourceId = outcome.resourceId ?? null
    record.lockedUntilMs = null
    record.updatedAtMs = now
    record.expiresAtMs = now + ttlMs
    this.#notify(scope, key)
    return true
  }

  async release(scope: string, key: string, token: number): Promise<boolean> {
    assertIdentity(scope, key)
    const record = this.#held(scope, key, token)
    if (!record) return false
    const now = this.#clock.now()
    record.lockedUntilMs = now
    record.updatedAtMs = now
    record.expiresAtMs = now + this.#abandonedRetentionMs
    this.#notify(scope, key)
    return true
  }

  async recordStep(scope: string, key: string, token: number, name: string, result: string | null): Promise<boolean> {
    assertRecordStep(scope, key, token, name, result)
    const record = this.#held(scope, key, token)
    if (!record) return false
    let steps = this.#steps.get(record)
    if (!steps) {
      steps = new Map()
      this.#steps.set(record, steps)
    }
    applyStep(steps, name, result)
    return true
  }

  async get(scope: string, key: string): Promise<StoredRecord | null> {
    assertIdentity(scope, key)
    const record = this.#records.get(scope)?.get(key)
    if (!record || record.expiresAtMs <= this.#clock.now()) return null
    return copyRecord(record)
  }

  async list(filter: ListFilter = {}): Promise<StoredRecord[]> {
    const limit = listLimit(filter)
    const now = this.#clock.now()
    const scopes = filter.scope === undefined ? [...this.#records.values()] : [this.#records.get(filter.scope) ?? new Map()]
    return scopes
      .flatMap((records) => [...records.values()])
      .filter((record) => matchesFilter(record, filter, now))
      .sort((a, b) => a.createdAtMs - b.createdAtMs)
      .slice(0, limit)
      .map(copyRecord)
  }

  async purgeExpired(limit: number): Promise<number> {
    assertPositiveInteger(limit, 'limit')
    const now = this.#clock.now()
    let purged = 0
    for (const [scope, records] of this.#records) {
      for (const [key, record] of records) {
        if (purged >= limit) return purged
        if (record.expiresAtMs <= now) {
          records.delete(key)
          purged++
        }
      }
      if (records.size === 0) this.#records.delete(scope)
    }
    return purged
  }

  async evict(scope: string, key: string): Promise<boolean> {
    assertIdentity(scope, key)
    const existed = this.#records.get(scope)?.delete(key) ?? false
    if (existed) this.#notify(scope, key)
    return existed
  }

  watch(scope: string, key: string, onChange: () => void): Unsubscribe {
    const id = recordId(scope, key)
    let listeners = this.#watchers.get(id)
    if (!listeners) {
      listeners = new Set()
      this.#watchers.set(id, listeners)
    }
    listeners.add(onChange)
    return () => {
      listeners.delete(onChange)
      if (listeners.size === 0) this.#watchers.delete(id)
    }
  }

  async close(): Promise<void> {
    this.#watchers.clear()
  }

  /** The record if `token` is current and it is in progress. */
  #held(scope: string, key: string, token: number): StoredRecord | undefined {
    const record = this.#records.get(scope)?.get(key)
    return record && record.token === token && record.status === 'in_progress' ? record : undefined
  }

  #notify(scope: string, key: string): void {
    if (this.#watchers.size === 0) return
    const listeners = this.#watchers.get(recordId(scope, key))
    if (listeners) for (const listener of [...listeners]) listener()
  }
}

function recordId(scope: string, key: string): string {
  // Scopes hold no control characters, so a newline cannot be forged into a collision.
  return `${scope}\n${key}`
}
