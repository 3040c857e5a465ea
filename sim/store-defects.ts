/**
 * Deliberate defects of the store itself (docs/testing.md, "Deliberate defects it catches"): the real
 * MemoryStore, wrapped from outside so that src/ stays as it ships, made to break one promise each.
 * - `early-takeover`: a takeover allowed half a lease before the lease ends, in the store's own time;
 * - `scope-blind`: the scope left out of the record's key (two tenants' same key is one record);
 * - `foreign-replay`: a completed record's answer handed to a request with another fingerprint.
 */
import type { MemoryStore } from '../src/backends/memory/memory-store.js'
import type { AcquireResult, IdempotencyStore } from '../src/core/store.js'

export const STORE_DEFECTS = ['early-takeover', 'scope-blind', 'foreign-replay', 'no-notify', 'evict-lingers'] as const
export type StoreDefect = (typeof STORE_DEFECTS)[number]

/** What the store server runs: a store that records steps and notifies its watchers. */
export type SimStore = IdempotencyStore & Required<Pick<IdempotencyStore, 'recordStep' | 'watch'>>

/** How far the store's clock reads ahead of true time, set only while a defective acquire runs. */
export interface StoreClockAhead {
  ms: number
}

/** The scope a scope-blind store keys every record by. */
const ONE_SCOPE = 'all'

export function defectiveStore(inner: MemoryStore, defect: StoreDefect, ahead: StoreClockAhead, leaseMs: number): SimStore {
  if (defect === 'early-takeover') {
    return withAcquire(inner, (scope, key, fingerprint, lease) => {
      // MemoryStore.acquire decides before its first await: the clock is read ahead only for this call.
      ahead.ms = leaseMs / 2
      try {
        return inner.acquire(scope, key, fingerprint, lease)
      } finally {
        ahead.ms = 0
      }
    })
  }
  if (defect === 'foreign-replay') {
    return withAcquire(inner, async (scope, key, fingerprint, lease) => {
      const result = await inner.acquire(scope, key, fingerprint, lease)
      if (result.kind !== 'mismatch') return result
      const record = await inner.get(scope, key)
      return record && record.status !== 'in_progress' ? { kind: 'replay', record } : result
    })
  }
  // no-notify: a store whose watch subscribes nobody (a LISTEN on the wrong channel): waiting requests only poll.
  if (defect === 'no-notify') return { ...bound(inner), watch: () => () => {} }
  // evict-lingers: an evict that says it removed the record and leaves it (a cache in front not invalidated).
  if (defect === 'evict-lingers') return { ...bound(inner), evict: async (scope, key) => (await inner.get(scope, key)) !== null }
  // scope-blind: every call on a record goes to one scope.
  const store: SimStore = bound(inner)
  for (const method of ['acquire', 'renew', 'complete', 'release', 'recordStep', 'get', 'evict', 'watch'] as const) {
    const real = inner[method] as (...args: unknown[]) => unknown
    Object.assign(store, { [method]: (_scope: string, ...rest: unknown[]) => real.call(inner, ONE_SCOPE, ...rest) })
  }
  return store
}

/** The store's own methods, bound to it (its fields are private: no prototype trick reaches them). */
function bound(inner: MemoryStore): SimStore {
  return {
    name: inner.name,
    serverClock: inner.serverClock,
    acquire: inner.acquire.bind(inner),
    renew: inner.renew.bind(inner),
    complete: inner.complete.bind(inner),
    release: inner.release.bind(inner),
    recordStep: inner.recordStep.bind(inner),
    get: inner.get.bind(inner),
    list: inner.list.bind(inner),
    purgeExpired: inner.purgeExpired.bind(inner),
    evict: inner.evict.bind(inner),
    watch: inner.watch.bind(inner),
    close: inner.close.bind(inner),
  }
}

function withAcquire(
  inner: MemoryStore,
  acquire: (scope: string, key: string, fingerprint: string, leaseMs: number) => Promise<AcquireResult>,
): SimStore {
  return { ...bound(inner), acquire }
}
