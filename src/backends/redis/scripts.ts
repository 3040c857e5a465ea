import type { AcquireResult, StoredRecord } from '../../core/store.js'
import { Script, toStoreError } from './client.js'
import {
  acquireLua,
  completeBatchLua,
  completeLua,
  evictLua,
  purgeLua,
  readLua,
  recordStepLua,
  releaseLua,
  renewLua,
  watchLua,
} from './lua.generated.js'
import { fromPacked, stepsFromFields, toMs } from './record.js'

/**
 * The store's Lua scripts (src/backends/redis/lua/, each file's header says what it takes and returns),
 * called by their SHA1. Each is one atomic step on one record, fenced by the caller's token.
 */
export const scripts = {
  acquire: new Script('acquire', acquireLua),
  renew: new Script('renew', renewLua),
  complete: new Script('complete', completeLua),
  completeBatch: new Script('completeBatch', completeBatchLua),
  release: new Script('release', releaseLua),
  read: new Script('read', readLua),
  evict: new Script('evict', evictLua),
  purge: new Script('purge', purgeLua),
  recordStep: new Script('recordStep', recordStepLua),
  watch: new Script('watch', watchLua),
}

/** The acquire script's reply (acquire.lua) as the store's answer. */
export function acquireAnswer(reply: unknown[], redisKey: string): AcquireResult {
  switch (reply[0]) {
    case 1:
      if (reply[2] === undefined) return { kind: 'acquired', token: reply[1] as number }
      return { kind: 'acquired', token: reply[1] as number, steps: stepsFromFields(reply[2] as unknown[]) }
    case 2:
      return { kind: 'in_progress', lockedUntilMs: reply[1] as number }
    case 3:
      return { kind: 'replay', record: fromPacked(reply[2] as Buffer, redisKey) }
    default:
      return { kind: 'mismatch' }
  }
}

/** The read script's reply (read.lua): the record with the server's time of the read, or null when there is none. */
export function readAnswer(reply: unknown[], redisKey: string): { record: StoredRecord; nowMs: number } | null {
  if (reply.length < 2) return null
  return { record: fromPacked(reply[1] as Buffer, redisKey), nowMs: toMs(reply[0]) }
}

/** Throws the store's error for a command's failure. */
export function fail(operation: string, key: string, error: unknown, client: object): never {
  throw toStoreError(operation, key, error, client)
}
