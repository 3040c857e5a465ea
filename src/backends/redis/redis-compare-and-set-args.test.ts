import { createHash } from 'node:crypto'
import { describe, expect, it } from 'vitest'
import type { Outcome } from '../../core/store.js'
import { serverHasSetIfEq } from './client.js'
import { type RedisArg, type RedisClientLike, RedisStore, recordNames } from './index.js'

// The native compare-and-set complete (SET ... IFEQ, Valkey 8.1+ and Redis 8.4+) at the level of the
// commands the store sends, against a fake client: this machine's Redis 7.0 has no IFEQ.
// src/backends/redis/redis-compare-and-set.test.ts runs the store on a real Redis with IFEQ emulated.
const fp = createHash('sha256').update('a').digest('hex')
const outcome = (body: Uint8Array | string, status: 'completed' | 'failed' = 'completed'): Outcome => ({
  status,
  response: {
    status: 201,
    headers: { 'content-type': 'application/json' },
    body: typeof body === 'string' ? new TextEncoder().encode(body) : body,
  },
})

const INFO_REDIS_7 = '# Server\r\nredis_version:7.0.15\r\nredis_mode:standalone\r\n'
const INFO_REDIS_84 = '# Server\r\nredis_version:8.4.0\r\nredis_mode:standalone\r\n'

/** A client that records every command and answers from `answer` (which may throw, as a server error). */
function fakeClient(answer: (command: string, args: RedisArg[]) => unknown) {
  const sent: Array<[string, ...RedisArg[]]> = []
  const client: RedisClientLike = {
    callBuffer: async (command: string, ...args: RedisArg[]) => {
      sent.push([command, ...args])
      return answer(command, args)
    },
    duplicate: () => {
      throw new Error('no subscriber in this test')
    },
    quit: async () => {},
  }
  return { client, sent, commands: () => sent.map(([command, ...args]) => (command === 'set' ? `set ${args[2]}` : command)) }
}

/** A server that has IFEQ (or not, per `info`) and answers `ifeq` to it. */
function server(info: string, ifeq: () => unknown = () => 'OK') {
  return fakeClient((command, args) => {
    if (command === 'info') return Buffer.from(info)
    if (command === 'set' && args.includes('NX')) return null // a new key
    if (command === 'set' && args[2] === 'IFEQ') return ifeq()
    if (command === 'evalsha') return 1
    throw new Error(`unexpected ${command}`)
  })
}

const settle = () => new Promise((resolve) => setImmediate(resolve))
const store = (client: RedisClientLike, nativeCompareAndSet?: boolean) =>
  new RedisStore({ client, prefix: 'cas', expiredGrace: 60_000, ...(nativeCompareAndSet === undefined ? {} : { nativeCompareAndSet }) })

describe('serverHasSetIfEq', () => {
  it.each([
    [INFO_REDIS_7, false],
    ['redis_version:8.2.3\r\n', false],
    [INFO_REDIS_84, true],
    ['redis_version:8.10.1\r\n', true],
    ['redis_version:9.0.0\r\n', true],
    ['redis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.0.2\r\n', false],
    ['redis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.1.0\r\n', true],
    ['redis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:9.0.0\r\n', true],
    ['redis_version:7.2.4\r\nserver_name:valkey\r\n', false],
    ['garbage', false],
  ])('reads %j as %s', (info, expected) => {
    expect(serverHasSetIfEq(info)).toBe(expected)
  })
})

describe('RedisStore complete by SET ... IFEQ (arguments)', () => {
  it('asks the server once, then completes its own fresh record with one SET IFEQ of exactly what its acquire wrote', async () => {
    const fake = server(INFO_REDIS_84)
    const s = store(fake.client)
    const names = recordNames('cas', 'sc', 'k')
    expect(await s.acquire('sc', 'k', fp, 30_000)).toEqual({ kind: 'acquired', token: 1 })
    await settle()
    expect(await s.complete('sc', 'k', 1, outcome('{"id":1}'), 5_000)).toBe(true)
    await s.acquire('sc', 'k2', fp, 30_000)
    expect(fake.commands()).toEqual(['set PX', 'info', 'set IFEQ', 'set PX'])
    const [, acquireKey, fresh] = fake.sent[0] as [string, string, string]
    expect(acquireKey).toBe(names.key)
    const identity = '2|1|sck'
    expect(fresh).toBe(`ik100n|30000|86400000|60000|${fp}${identity}`)
    const [, key, value, ifeq, old, px, ms] = fake.sent[2] as [string, string, string, string, string, string, number]
    expect([key, ifeq, old, px, ms]).toEqual([names.key, 'IFEQ', fresh, 'PX', 65_000])
    const headers = '{"content-type":"application/json"}'
    const head = `201|-1|${headers.length}|${headers}`
    expect(value).toMatch(new RegExp(`^ik100C\\|5000\\|60000\\|\\d+\\|${fp}${identity.replace(/\|/g, '\\|')}`))
    expect(value.endsWith(`${fp}${identity}${head}{"id":1}`)).toBe(true)
  })

  it('writes a failed outcome as F, and a body that is not UTF-8 as bytes', async () => {
    const fake = server(INFO_REDIS_84)
    const s = store(fake.client, true)
    await s.acquire('sc', 'k', fp, 30_000)
    expect(await s.complete('sc', 'k', 1, outcome(new Uint8Array([0xff, 0x00, 0xfe]), 'failed'), 5_000)).toBe(true)
    const value = fake.sent[1]?.[2] as Buffer
    expect(Buffer.isBuffer(value)).toBe(true)
    expect(value.subarray(0, 6).toString()).toBe('ik100F')
    expect([...value.subarray(value.length - 3)]).toEqual([0xff, 0x00, 0xfe])
    expect(fake.commands()).toEqual(['set PX', 'set IFEQ']) // the option given: no INFO
  })

  it('leaves the decision to the script when the IFEQ does not match (another token, a waiter, a renewal, no key)', async () => {
    const fake = server(INFO_REDIS_84, () => null)
    const s = store(fake.client, true)
    await s.acquire('sc', 'k', fp, 30_000)
    expect(await s.complete('sc', 'k', 1, outcome('x'), 5_000)).toBe(true) // the fake script answers 1
    expect(fake.commands()).toEqual(['set PX', 'set IFEQ', 'evalsha'])
  })

  it('never sends IFEQ for another token, after a renewal or a release, or for a record another process acquired', async () => {
    const fake = server(INFO_REDIS_84)
    const s = store(fake.client, true)
    await s.acquire('sc', 'a', fp, 30_000)
    await s.complete('sc', 'a', 2, outcome('x'), 5_000)
    await s.acquire('sc', 'b', fp, 30_000)
    await s.renew('sc', 'b', 1, 30_000)
    await s.complete('sc', 'b', 1, outcome('x'), 5_000)
    await s.acquire('sc', 'c', fp, 30_000)
    await s.release('sc', 'c', 1)
    await s.complete('sc', 'c', 1, outcome('x'), 5_000)
    await s.complete('sc', 'elsewhere', 1, outcome('x'), 5_000)
    expect(fake.commands().filter((c) => c === 'set IFEQ')).toEqual([])
  })

  it('uses the script alone on a server without IFEQ, asking only once', async () => {
    const fake = server(INFO_REDIS_7)
    const s = store(fake.client)
    await s.acquire('sc', 'a', fp, 30_000)
    await settle()
    await s.complete('sc', 'a', 1, outcome('x'), 5_000)
    await s.acquire('sc', 'b', fp, 30_000)
    await s.complete('sc', 'b', 1, outcome('x'), 5_000)
    expect(fake.commands()).toEqual(['set PX', 'info', 'evalsha', 'set PX', 'evalsha'])
  })

  it('turns IFEQ off for good when the server refuses it, completing by script', async () => {
    const fake = server(INFO_REDIS_84, () => {
      throw new Error('ERR syntax error')
    })
    const s = store(fake.client, true)
    await s.acquire('sc', 'a', fp, 30_000)
    expect(await s.complete('sc', 'a', 1, outcome('x'), 5_000)).toBe(true)
    await s.acquire('sc', 'b', fp, 30_000)
    expect(await s.complete('sc', 'b', 1, outcome('x'), 5_000)).toBe(true)
    expect(fake.commands()).toEqual(['set PX', 'set IFEQ', 'evalsha', 'set PX', 'evalsha'])
  })

  it('keeps the script with nativeCompareAndSet: false, without asking the server', async () => {
    const fake = server(INFO_REDIS_84)
    const s = store(fake.client, false)
    await s.acquire('sc', 'a', fp, 30_000)
    await settle()
    await s.complete('sc', 'a', 1, outcome('x'), 5_000)
    expect(fake.commands()).toEqual(['set PX', 'evalsha'])
  })
})
