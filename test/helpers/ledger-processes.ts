/**
 * Multi-process tests of the Ledger on one store, run in separate Node processes
 * (test/fixtures/processes/ledger-worker.ts) as deployments run it: holders killed by SIGKILL
 * mid-work and taken over by other processes, and processes racing over the same keys.
 * Each store's test file calls {@link describeLedgerProcesses} with its own store location.
 */
import { type ChildProcess, spawn } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import { join } from 'node:path'
import { createInterface } from 'node:readline'
import { setTimeout as sleep } from 'node:timers/promises'
import type { IdempotencyStore } from '../../src/core/store.js'
import type { WorkerConfig } from '../fixtures/processes/ledger-worker.js'
import { expectRaced } from './race-rounds.js'

const WORKER = join(import.meta.dirname, '..', 'fixtures', 'processes', 'ledger-worker.ts')

/** One line a worker printed, with who printed it and when it arrived. */
export interface Line {
  pid: number
  at: number
  words: string[]
}

interface Worker {
  child: ChildProcess
  pid: number
  ready: Promise<void>
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>
  /** Resolves with the first line (printed so far or later) that `match` accepts. */
  line(match: (words: string[]) => boolean): Promise<Line>
}

/** Starts one worker process (its lines go to `log` too), with extra environment `env`. */
export function startWorker(config: WorkerConfig, log: Line[], env?: NodeJS.ProcessEnv): Worker {
  const child = spawn(process.execPath, ['--import', 'tsx', WORKER, JSON.stringify(config)], {
    stdio: ['pipe', 'pipe', 'inherit'],
    ...(env ? { env: { ...process.env, ...env } } : {}),
  })
  const pid = child.pid as number
  const mine: Line[] = []
  const waiting: Array<{ match: (words: string[]) => boolean; resolve: (line: Line) => void }> = []
  createInterface({ input: child.stdout as NodeJS.ReadableStream }).on('line', (text) => {
    const line = { pid, at: Date.now(), words: text.split(' ') }
    mine.push(line)
    log.push(line)
    for (const w of [...waiting]) {
      if (w.match(line.words)) {
        waiting.splice(waiting.indexOf(w), 1)
        w.resolve(line)
      }
    }
  })
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.once('exit', (code, signal) => {
      log.push({ pid, at: Date.now(), words: ['exit', String(signal ?? code)] })
      resolve({ code, signal })
    }),
  )
  const line = (match: (words: string[]) => boolean) =>
    new Promise<Line>((resolve, reject) => {
      const seen = mine.find((l) => match(l.words))
      if (seen) return resolve(seen)
      waiting.push({ match, resolve })
      void exited.then(({ code, signal }) => reject(new Error(`worker ${pid} exited (${signal ?? code}) before the expected line`)))
    })
  return { child, pid, ready: line((w) => w[0] === 'ready').then(() => {}), exited, line }
}

/** What the log says about each key: the runs that started (with pid and token), the ones that ended, the answers. */
function byKey(log: Line[]) {
  const keys = new Map<string, { starts: Line[]; ends: Line[]; answers: Array<{ pid: number; kind: string; ranBy: number | null }> }>()
  const of = (key: string) => {
    let entry = keys.get(key)
    if (!entry) {
      entry = { starts: [], ends: [], answers: [] }
      keys.set(key, entry)
    }
    return entry
  }
  for (const line of log) {
    const [what, key] = line.words as [string, string]
    if (what === 'start') of(key).starts.push(line)
    if (what === 'end') of(key).ends.push(line)
    if (what === 'result') {
      const results = JSON.parse(line.words.slice(1).join(' ')) as Record<string, [string, number | null]>
      for (const [k, [kind, ranBy]] of Object.entries(results)) of(k).answers.push({ pid: line.pid, kind, ranBy })
    }
  }
  return keys
}

const token = (line: Line) => Number(line.words[2])

/** `items` in an order fixed by `seed`: each worker goes through the keys in its own order. */
function shuffled<T>(items: T[], seed: number): T[] {
  const out = [...items]
  let s = seed
  for (let i = out.length - 1; i > 0; i--) {
    s = (s * 1_103_515_245 + 12_345) % 2 ** 31
    const j = s % (i + 1)
    ;[out[i], out[j]] = [out[j] as T, out[i] as T]
  }
  return out
}

/** Options of {@link describeLedgerProcesses}. */
export interface LedgerProcessesOptions {
  /** The store's URL for the workers (see WorkerConfig.store): each test uses its own scope in it. */
  url: () => string
  /** The same store, opened in the test process, to read the records. */
  store: () => IdempotencyStore
  /** The lease the workers run with: long enough that a loaded machine never stalls a live holder past it. @default 1500 */
  leaseMs?: number
  /** Keys of the random-crash test. @default 40 */
  crashKeys?: number
  /** Also race processes over the same keys, this many each. */
  race?: { processes: number; keys: number }
  /**
   * Extra environment of the `n`th worker a test starts (0, 1, 2, … in the order they start): how the
   * clock-skew tests give each process its own clock (libfaketime's `FAKETIME`).
   */
  env?: (n: number) => NodeJS.ProcessEnv
}

/** Registers the multi-process tests (in the caller's describe). */
export function describeLedgerProcesses(options: LedgerProcessesOptions): void {
  const leaseMs = options.leaseMs ?? 1_500
  const children: ChildProcess[] = []
  // Workers are numbered per test (per log): the first two of a test get different clocks.
  const started = new WeakMap<Line[], number>()
  const spawnWorker = (config: Omit<WorkerConfig, 'store' | 'leaseMs'>, log: Line[]) => {
    const n = started.get(log) ?? 0
    started.set(log, n + 1)
    const worker = startWorker({ store: options.url(), leaseMs, ...config }, log, options.env?.(n))
    children.push(worker.child)
    return worker
  }
  afterAll(() => {
    for (const child of children) if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL')
  })

  it('takes over a holder process killed by SIGKILL mid-work: another process waits out its lease, runs the key once with token 2, and the dead holder never comes back', async () => {
    const scope = `killed-${randomUUID()}`
    const log: Line[] = []
    const holder = spawnWorker({ scope, keys: ['order'], lanes: 1, workMs: 0, hold: true }, log)
    const started = await holder.line((w) => w[0] === 'start')
    expect(started.words).toEqual(['start', 'order', '1', '0'])
    holder.child.kill('SIGKILL')
    expect((await holder.exited).signal).toBe('SIGKILL')
    const killedAt = Date.now()
    expect(await options.store().get(scope, 'order')).toMatchObject({ status: 'in_progress', token: 1 })

    const taker = spawnWorker({ scope, keys: ['order'], lanes: 1, workMs: 10 }, log)
    const took = await taker.line((w) => w[0] === 'start')
    expect(await taker.exited).toEqual({ code: 0, signal: null })
    // Not before the lease of the dead holder ended: it renewed every third of a lease while alive, so
    // its lease outlived it by two thirds of one (a third here: a loaded machine delays renewals).
    expect(took.at - killedAt, 'ms from the kill to the takeover').toBeGreaterThanOrEqual(leaseMs / 3)
    expect(took.words).toEqual(['start', 'order', '2', '1'])
    const keys = byKey(log).get('order')
    expect(keys?.ends.map((l) => [l.pid, token(l)])).toEqual([[taker.pid, 2]])
    expect(keys?.answers).toEqual([{ pid: taker.pid, kind: 'executed:completed', ranBy: taker.pid }])
    const record = await options.store().get(scope, 'order')
    expect(record).toMatchObject({ status: 'completed', token: 2, attempts: 2 })
    expect(JSON.parse(Buffer.from(record?.response?.body ?? []).toString())).toEqual({ pid: taker.pid, token: 2 })
    // Past another lease: nothing of the dead holder's attempt reappears.
    await sleep(leaseMs + 100)
    expect(await options.store().get(scope, 'order')).toEqual(record)
  })

  const crashKeys = options.crashKeys ?? 40
  it(`runs each of ${crashKeys} keys to one completion while holder processes are SIGKILLed at random: the next process takes over with the next token, never two holders`, async () => {
    const scope = `crash-${randomUUID()}`
    const log: Line[] = []
    const keys = Array.from({ length: crashKeys }, (_, i) => `key-${i}`)
    let kills = 0
    // The first worker of slot 1 kills itself in its first run; the other slots start once it has
    // exited, so it surely gets a key to die on (started beside them, it could find every key done).
    let firstGone!: () => void
    const firstExited = new Promise<void>((resolve) => {
      firstGone = resolve
    })
    // Three worker slots; a killed worker is replaced by a new process, as a supervisor would.
    await Promise.all(
      [1, 2, 3].map(async (slot) => {
        if (slot !== 1) await firstExited
        for (let life = 0; ; life++) {
          const s = slot * 1_000 + life
          const order = shuffled(keys, s)
          const worker = spawnWorker(
            { scope, keys: order, lanes: 4, workMs: 30, crash: life >= 3 ? 0 : 0.08, crashFirst: slot === 1 && life === 0, seed: s },
            log,
          )
          const { code, signal } = await worker.exited
          if (slot === 1 && life === 0) firstGone()
          if (signal === 'SIGKILL') {
            kills++
            continue
          }
          expect(code, `worker ${worker.pid} exit code`).toBe(0)
          return
        }
      }),
    )
    expect(kills, 'workers killed: the test did exercise crashes').toBeGreaterThan(0)
    const store = options.store()
    const seen = byKey(log)
    const records = new Map<string, unknown>()
    let takeovers = 0
    const exitedAt = new Map(log.filter((l) => l.words[0] === 'exit').map((l) => [l.pid, l]))
    for (const key of keys) {
      const { starts, ends, answers } = seen.get(key) ?? { starts: [], ends: [], answers: [] }
      const record = await store.get(scope, key)
      records.set(key, record)
      expect(record?.status, key).toBe('completed')
      // One run ended with the token the record holds. Any other run was in a process that was killed,
      // with an older token: before it ended, or after it ended but before its outcome was stored.
      const final = ends.filter((end) => token(end) === record?.token)
      expect(final, key).toHaveLength(1)
      const [end] = final as [Line]
      for (const other of ends.filter((e) => e !== end)) {
        expect(token(other), `${key}: an unrecorded run is older`).toBeLessThan(token(end))
        expect(exitedAt.get(other.pid)?.words[1], `${key}: an unrecorded run's process was killed`).toBe('SIGKILL')
      }
      expect(new Set(starts.map(token)).size, `${key}: one token, one run`).toBe(starts.length)
      // Never two holders at once: each run starts after the one before it ended or its process died.
      const runs = [...starts].sort((a, b) => token(a) - token(b))
      for (let i = 1; i < runs.length; i++) {
        const before = runs[i - 1] as Line
        const over = ends.find((e) => e.pid === before.pid && token(e) === token(before)) ?? exitedAt.get(before.pid)
        expect(
          (runs[i] as Line).at,
          `${key}: token ${token(runs[i] as Line)} started after token ${token(before)} was over`,
        ).toBeGreaterThanOrEqual(over?.at ?? Number.POSITIVE_INFINITY)
        expect((runs[i] as Line).words[3], `${key}: a later token is a takeover`).toBe('1')
      }
      expect(token(runs.at(-1) as Line), key).toBe(token(end))
      takeovers += runs.length - 1
      expect(record?.attempts, key).toBeGreaterThanOrEqual(starts.length)
      expect(JSON.parse(Buffer.from(record?.response?.body ?? []).toString()), key).toEqual({ pid: end.pid, token: token(end) })
      // Every surviving process answered with the value of that one run.
      for (const answer of answers) expect(answer.ranBy, `${key} as answered to ${answer.pid}`).toBe(end.pid)
    }
    expect(takeovers, 'keys taken over from a killed holder').toBeGreaterThan(0)
    // Past another lease: no killed holder's attempt comes back.
    await sleep(leaseMs + 100)
    for (const key of keys) expect(await store.get(scope, key), key).toEqual(records.get(key))
  })

  const race = options.race
  if (race) {
    it(`runs each of ${race.keys} keys exactly once when ${race.processes} processes run all of them at once through the Ledger`, async () => {
      await expectRaced(async () => {
        const scope = `race-${randomUUID()}`
        const log: Line[] = []
        const keys = Array.from({ length: race.keys }, (_, i) => `key-${i}`)
        const workers = Array.from({ length: race.processes }, (_, i) => {
          // Each starts at another key, so that the first to start cannot sweep them all.
          const offset = Math.floor((i * race.keys) / race.processes)
          return spawnWorker({ scope, keys: [...keys.slice(offset), ...keys.slice(0, offset)], lanes: 16, workMs: 5, go: true }, log)
        })
        await Promise.all(workers.map((w) => w.ready))
        for (const worker of workers) worker.child.stdin?.write('go\n')
        for (const worker of workers) expect(await worker.exited, `worker ${worker.pid}`).toEqual({ code: 0, signal: null })
        const seen = byKey(log)
        const executors = new Set<number>()
        const store = options.store()
        for (const key of keys) {
          const { starts, ends, answers } = seen.get(key) ?? { starts: [], ends: [], answers: [] }
          expect(
            starts.map((s) => s.words.slice(2)),
            `${key} ran once, with token 1`,
          ).toEqual([['1', '0']])
          expect(ends, key).toHaveLength(1)
          const ranBy = (ends[0] as Line).pid
          executors.add(ranBy)
          expect(answers, key).toHaveLength(race.processes)
          for (const answer of answers) {
            expect(answer.kind, key).toBe(answer.pid === ranBy ? 'executed:completed' : 'replayed')
            expect(answer.ranBy, key).toBe(ranBy)
          }
          expect(await store.get(scope, key), key).toMatchObject({ status: 'completed', token: 1, attempts: 1 })
        }
        return executors.size
      })
    })
  }
}
