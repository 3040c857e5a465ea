/**
 * An app process of a simulated deployment (sim/scenario.ts): the real Ledger and HTTP engine with the payments
 * handler and its checks, the responses the simulated network hands clients, and the defects injected into the
 * ledger's real code.
 */

import { Held } from '../src/core/held.js'
import { Ledger } from '../src/core/ledger.js'
import type { Begun, LedgerEvent, RunResult } from '../src/core/ledger-types.js'
import { Renewal } from '../src/core/renewal.js'
import type { Reconcile } from '../src/core/steps.js'
import { StepLog } from '../src/core/steps.js'
import { StoreCalls } from '../src/core/store-calls.js'
import { IdempotencyError } from '../src/errors.js'
import { createEngine } from '../src/http/engine.js'
import type { HttpRequestLike, HttpResponseLike, IdempotencyContext } from '../src/http/types.js'
import type { Defect } from './scenario.js'
import {
  type Bank,
  decoder,
  encoder,
  type Faults,
  type History,
  holderId,
  intentId,
  LEASE_MS,
  NetworkError,
  NetworkStore,
  RUN_DEADLINE_MS,
  SCOPE_PREFIX,
  type SimTx,
  STORE_TIMEOUT_MS,
  type StoreServer,
  storeTime,
  TTL_MS,
  tenantOf,
  throughTransaction,
} from './store-side.js'
import { Proc, type World } from './world.js'

export class App {
  readonly proc: Proc
  readonly store: NetworkStore
  readonly handle: (req: HttpRequestLike) => Promise<HttpResponseLike>

  constructor(world: World, id: string, server: StoreServer, bank: Bank, faults: Faults, history: History, defect: Defect | undefined) {
    const rng = world.rng
    this.proc = new Proc(world, id, rng.between(-300, 300))
    const proc = this.proc
    const store = new NetworkStore(proc, server, faults, history, defect)
    const reconciles = reconciling(id)
    store.reconciles = reconciles
    this.store = store
    const ledger = new Ledger({
      store,
      clock: proc.clock,
      storeTimeoutClock: proc.clock,
      lease: LEASE_MS,
      wait: WAIT_MS,
      ttl: TTL_MS,
      storeTimeout: STORE_TIMEOUT_MS,
      telemetry: history.reports.telemetry(proc),
      onEvent: (event) => {
        history.reports.listen(event)
        if (event.type === 'unrecorded') {
          const holder = holderId(event.scope, event.key, event.token)
          history.unrecordedStatus.set(holder, event.status)
          // A value that cannot be recorded (sim/app.ts, the third way in) is reported at once, and no answer is
          // sent for it: the record stays held until its lease ends, and a later attempt answers.
          if (history.unstorable.has(holder)) return
          history.unrecorded.add(intentId(tenantOf(event.scope), event.key))
          // An outcome the store could not take is retried until shortly before the lease ends (a tenth of it,
          // src/core/store-calls.ts), not given up while the lease, as the process could know it, still protects
          // the record (a renewal whose reply was lost extends it only in the store; a zombie is exempt).
          const lease = history.leases.get(holder)
          const knownEndMs = history.lastGrant.get(holder)?.endsAtMs
          if (
            lease !== undefined &&
            knownEndMs !== undefined &&
            proc.disturbances === lease.disturbances &&
            world.now < knownEndMs - LEASE_MS / 10 - 100
          )
            history.violation(`${holder} gave its outcome up as unrecorded ${(knownEndMs - world.now).toFixed(0)}ms before its lease ended`)
        }
      },
    })
    // The run deadline of each request that has one, by request: the handler notes it under its holder.
    const deadlines = new WeakMap<HttpRequestLike, number>()
    /**
     * The processes of the third app slot reconcile (as a fleet mid-deploy does): their steps leave a started
     * marker, and on a takeover `reconcile` gets the steps an earlier attempt started and did not record. It
     * asks the bank whether the charge went through and, when it did, records it, so the charge step returns
     * it without running (an intent that captures values is left to run again: the bank dedupes it).
     */
    const reconcile: Reconcile = async (pending, rctx) => {
      const holder = holderId(rctx.scope, rctx.key, rctx.token)
      const record = intentId(rctx.scope, rctx.key)
      history.reconciling.add(holder)
      const earlier = history.earlierGrant(rctx.scope, rctx.key, rctx.token)
      if (earlier === undefined) history.violation(`${holder} was handed steps to reconcile on a first attempt`)
      const expected = [...(history.pendingAtAcquire.get(holder) ?? [])].sort().join(',')
      const given = pending
        .map((p) => p.name)
        .sort()
        .join(',')
      if (given !== expected)
        history.violation(`${holder} was handed [${given}] to reconcile, the store held [${expected}] started and unrecorded`)
      for (const step of pending) {
        if (step.key !== history.derivedKey(rctx.key, step.name))
          history.violation(`${holder} was handed step ${step.name} of ${record} to reconcile under the key ${step.key}`)
        if (step.name !== 'charge') continue
        const amount = earlier === undefined ? undefined : history.holderAmounts.get(holderId(rctx.scope, rctx.key, earlier))
        const id = bank.lookup(`${tenantOf(rctx.scope)}|${step.key}`)
        if (id === undefined || amount === undefined || amount % 3 === 0) continue
        const reconciled = history.reconciled.get(holder) ?? new Set<string>()
        reconciled.add('charge')
        history.reconciled.set(holder, reconciled)
        await rctx.recordStep('charge', id)
      }
    }
    const engineOptions = {
      runOptionsOf: (req: HttpRequestLike): { deadlineMs?: number } => {
        if (req.headers['x-deadline'] === undefined) return {}
        const deadlineMs = proc.clock.now() + RUN_DEADLINE_MS
        deadlines.set(req, deadlineMs)
        return { deadlineMs }
      },
    }
    const engine = createEngine(
      { ledger, scope: (req) => String(req.headers['x-tenant']), ...(reconciles ? { reconcile } : {}) },
      engineOptions,
    )
    /**
     * A fourth way in, for the keys that end in 5: the HTTP engine with `transactional: true`, as an orders API on
     * PostgreSQL runs it. The handler's charge is a row in the store's own database (an order, keyed by nothing),
     * written in the transaction that completes the record; a declined order (a 402, a final failure) keeps none
     * of its writes, a transient failure keeps nothing and is released.
     */
    const txEngine = createEngine(
      { ledger, scope: (req) => String(req.headers['x-tenant']), transactional: true, ...(reconciles ? { reconcile } : {}) },
      engineOptions,
    )
    const network = (ms: number) => new Promise<void>((resolve) => world.at(ms, proc, resolve))

    /** The payments handler: reserve, charge at the bank (keyed by a derived key), email; each a durable step. */
    const pay = async (req: HttpRequestLike, ctx: IdempotencyContext | undefined, tx?: SimTx): Promise<HttpResponseLike> => {
      const scope = String(req.headers['x-tenant'])
      const input = JSON.parse(decoder.decode(await req.body(1_024))) as { intent: string; amount: number }
      if (!ctx) return { status: 400, headers: {}, body: new Uint8Array(0) }
      const holder = holderId(ctx.scope, ctx.key, ctx.token)
      if (throughTransaction(ctx.key) !== (tx !== undefined))
        history.violation(`${holder} ran ${tx ? 'in' : 'outside'} a transaction, which its way in does not`)
      history.holderAmounts.set(holder, input.amount)
      const deadlineMs = deadlines.get(req)
      if (deadlineMs !== undefined) history.deadlines.set(holder, deadlineMs)
      const record = intentId(ctx.scope, ctx.key)
      // On a process that reconciles, a takeover that found steps started and unrecorded reconciled them first.
      if (reconciles && (history.pendingAtAcquire.get(holder)?.size ?? 0) > 0 && !history.reconciling.has(holder))
        history.violation(
          `${holder} found [${[...(history.pendingAtAcquire.get(holder) ?? [])].join(',')}] started and unrecorded, and ran with no reconcile`,
        )
      // A takeover is an attempt after an earlier one that did not finish: the store granted this record before.
      const earlier = history.earlierGrant(ctx.scope, ctx.key, ctx.token) !== undefined
      if (ctx.takeover !== earlier)
        history.violation(
          `${holder} was told takeover ${ctx.takeover}, yet the store ${earlier ? 'had' : 'had never'} granted the record before`,
        )
      // A holder whose lease ended in the store a while ago (renewals every third of a lease, each failing
      // within two store timeouts) while its process ran undisturbed has seen its renewals fail for a whole
      // lease: its signal is aborted before it starts or goes on from a step (src/core/renewal.ts).
      // One intent in four first asks a fraud service, not as a step and without looking at its signal, now and
      // then slowly (past a lease): a signal first read after the lease was lost must already be aborted.
      if (input.amount % 4 === 2) await network(rng.chance(0.25) ? rng.between(LEASE_MS * 0.5, LEASE_MS * 2.5) : rng.between(1, 20))
      const signal = ctx.signal
      if (!(signal instanceof AbortSignal)) history.violation(`${holder} was handed no abort signal`)
      // A signal first read after a renewal was refused (the process knows its lease is lost) is aborted already.
      if (history.fencedHolders.has(holder) && !signal.aborted)
        history.violation(`${holder} first read its signal after the store refused its renewal, and it is not aborted`)
      // Renewals that fail lose the lease only once they have failed for a whole lease since the last one granted
      // (or the acquire): a signal aborted sooner, with no renewal refused and the run deadline ahead, gave up a
      // lease the store still honoured.
      signal.addEventListener(
        'abort',
        () => {
          const lease = history.leases.get(holder)
          const grantedAtMs = history.lastGrant.get(holder)?.atMs
          const deadlineMs = history.deadlines.get(holder)
          if (
            lease !== undefined &&
            grantedAtMs !== undefined &&
            proc.disturbances === lease.disturbances &&
            !history.fencedHolders.has(holder) &&
            !(deadlineMs !== undefined && proc.clock.now() >= deadlineMs) &&
            world.now - grantedAtMs < LEASE_MS - 5
          )
            history.violation(
              `${holder}'s signal was aborted ${(world.now - grantedAtMs).toFixed(0)}ms after its last renewal granted, before its renewals could have failed for a whole lease`,
            )
        },
        { once: true },
      )
      const lostSignal = (when: string) => {
        const lease = history.leases.get(holder)
        if (
          lease !== undefined &&
          // Inside a transaction the ledger stops renewing at the first step: the row lock keeps the record.
          !tx &&
          storeTime(world.now) > storeTime(lease.endsAtMs) + LEASE_MS / 3 + 2 * STORE_TIMEOUT_MS + 100 &&
          proc.state === 'up' &&
          proc.disturbances === lease.disturbances &&
          !signal.aborted
        )
          history.violation(
            `${holder} ${when}, ${(world.now - lease.endsAtMs).toFixed(0)}ms after its lease ended in the store, and its signal is not aborted`,
          )
      }
      // The converse: a signal is aborted only for a lost lease (FENCED_OUT, naming the key), and never while every
      // renewal the holder sent was granted and its run deadline is ahead (a renewal past it is not sent).
      const abortedForNothing = (when: string) => {
        if (!signal.aborted) return
        const reason: unknown = signal.reason
        if (!(reason instanceof IdempotencyError) || reason.code !== 'FENCED_OUT' || !reason.message.includes(ctx.key))
          history.violation(`${holder} ${when} with its signal aborted by ${String(reason)}, not a FENCED_OUT naming its key`)
        const lease = history.leases.get(holder)
        const deadlineMs = history.deadlines.get(holder)
        if (
          lease !== undefined &&
          proc.disturbances === lease.disturbances &&
          !history.fencedHolders.has(holder) &&
          (history.renewalsSent.get(holder) ?? 0) === (history.renewalsGranted.get(holder) ?? 0) &&
          !(deadlineMs !== undefined && proc.clock.now() >= deadlineMs)
        )
          history.violation(`${holder} ${when} with its signal aborted, though every renewal it sent was granted`)
      }
      /** Notes that `holder` runs `name` of the record now, checking that no other holder's work runs at once. */
      const enter = (name: string): Map<string, string> => {
        // The work of one intent never runs twice at once: no two holders of the record inside a step
        // while both their leases last in the store (a zombie's has ended: the fence stops its writes).
        const running = history.running.get(record) ?? new Map<string, string>()
        history.running.set(record, running)
        const own = history.leases.get(holder)
        for (const [other, step] of running) {
          const lease = history.leases.get(other)
          if (
            other !== holder &&
            lease !== undefined &&
            own !== undefined &&
            storeTime(world.now) < storeTime(Math.min(lease.endsAtMs, own.endsAtMs))
          )
            history.violation(`the work of ${record} ran twice at once: ${holder} started ${name} while ${other} ran ${step} in its lease`)
        }
        running.set(holder, name)
        return running
      }
      // A plain transactional handler (one order in three): no durable steps, the order row its only write, the
      // fence of the completion in its transaction its only guard against a zombie.
      const plain = tx !== undefined && input.amount % 3 === 1
      const run = async <T>(name: string, fn: () => Promise<T> | T): Promise<T> => {
        if (plain) {
          const running = enter(name)
          try {
            return await fn()
          } finally {
            running.delete(holder)
          }
        }
        if (tx) history.renewalsStopping.add(holder)
        return ctx.step(name, async (step) => {
          lostSignal(`started step ${name}`)
          abortedForNothing(`started step ${name}`)
          // A holder that knows its lease is lost starts no step (checked where nothing is awaited between the
          // ledger's check and the step: a process that reconciles awaits its started marker in between).
          if (signal.aborted && !reconciles) history.violation(`${holder} started step ${name} though it knew its lease was lost`)
          if (step.signal !== signal) history.violation(`step ${name} of ${holder} sees another signal than its attempt's`)
          if (step.key !== history.derivedKey(ctx.key, name)) history.violation(`step ${name} of ${holder} was handed the key ${step.key}`)
          // A step the store refused to record (the token is stale) ends the attempt's work: it throws FENCED_OUT.
          if (history.stepRefused.has(holder)) history.violation(`${holder} started step ${name} after the store refused to record one`)
          if (history.recordedAtAcquire.get(holder)?.has(name))
            history.violation(`step ${name} of ${holder} ran again after it was recorded`)
          if (history.reconciled.get(holder)?.has(name)) history.violation(`step ${name} of ${holder} ran after its reconcile recorded it`)
          if (history.fencedHolders.has(holder)) history.violation(`${holder} ran step ${name} after the store refused its renewal`)
          world.log(() => `${proc.id} ${holder} runs step ${name}`)
          const running = enter(name)
          try {
            return await fn()
          } finally {
            running.delete(holder)
            lostSignal(`ran step ${name} to its end`)
            abortedForNothing(`ran step ${name} to its end`)
          }
        })
      }
      await run('reserve', async () => {
        // Now and then a slow reservation, alive: longer than a lease, so the holder must renew to keep it.
        await network(rng.chance(0.05) ? rng.between(LEASE_MS * 0.5, LEASE_MS * 2.5) : rng.between(1, 30))
        return { reserved: input.amount }
      })
      // One intent in three captures values (durable: every attempt gets the first attempt's) and charges with
      // them: the answer carries both what this attempt captured and what the charge step recorded, which
      // must be the same (checked by the client). uuid() and random() are not seeded: they are only compared.
      const captured =
        input.amount % 3 === 0
          ? {
              at: await ctx.now(),
              ref: await ctx.uuid(),
              luck: await ctx.random(),
              mark: await ctx.capture('mark', () => `${holder}@${world.now}`),
            }
          : undefined
      if (
        captured &&
        (typeof captured.at !== 'number' ||
          !/^[0-9a-f-]{36}$/.test(String(captured.ref)) ||
          !(typeof captured.luck === 'number' && captured.luck >= 0 && captured.luck < 1) ||
          !String(captured.mark).startsWith(`${record}#`))
      )
        history.violation(
          `${holder} captured values that are not a time, a uuid, a random number and its mark: ${JSON.stringify(captured)}`,
        )
      const charge = await run('charge', async () => {
        await network(rng.between(1, 30))
        if (rng.chance(0.03)) {
          history.transientEnd.set(holder, proc)
          throw new NetworkError('bank unavailable') // transient: released, retried
        }
        // The bank is shared by the tenants: its key is the tenant's account and the key derived from the request's.
        // In a transaction the charge is an order row in the store's database instead, keyed by nothing.
        const id = tx
          ? await store.insertOrder(tx, intentId(scope, ctx.key), holder)
          : bank.charge(`${scope}|${history.derivedKey(ctx.key, 'charge')}`, intentId(scope, ctx.key))
        return captured ? { id, captured } : id
      })
      // One order in seven is declined once written (402): a final failure, whose writes the transaction must not keep.
      if (tx && input.amount % 7 === 0) return { status: 402, headers: {}, body: encoder.encode('{"error":"declined"}') }
      // Now and then the mail provider is down and the handler answers 503 itself (not a throw): a transient
      // answer, which the engine releases for a retry and never stores (checked at the store's complete).
      if (rng.chance(0.03)) {
        history.transientEnd.set(holder, proc)
        return { status: 503, headers: { 'retry-after': '0' }, body: encoder.encode('mail provider unavailable') }
      }
      await run('email', async () => {
        await network(rng.between(1, 20))
        return true
      })
      // Pretty-printed on purpose: a replay that re-encodes the JSON changes these bytes.
      const body = encoder.encode(
        JSON.stringify(
          { intent: input.intent, amount: input.amount, tenant: scope, charge, captured, by: proc.id, token: ctx.token },
          null,
          1,
        ),
      )
      return { status: 201, headers: { 'content-type': 'application/json' }, body }
    }

    /**
     * A second way in, as a queue consumer or an RPC handler has: the same payments handler through
     * `ledger.run` itself, not the HTTP engine's `begin`, for the keys that end in 3 (every attempt at one
     * key takes the same way). Its answers map the run's result to what the engine would send.
     */
    type Answer = { status: number; text: string }
    /** How both ways in that store the handler's answer class it, as the HTTP engine does: a 5xx transient, a 4xx failed. */
    const classOf = (value: Answer) => (value.status >= 500 ? 'transient' : value.status >= 400 ? 'failed' : 'completed')
    const answer = (status: number, text: string, headers: Record<string, string> = {}): HttpResponseLike => ({
      status,
      headers: { 'content-type': 'application/json', ...headers },
      body: encoder.encode(text),
    })
    /** What the engine would send for a run's result (`ledger.run`'s, or `begin` and `finish`'s). */
    const answerOf = (tenant: string, key: string, result: RunResult<Answer>): HttpResponseLike => {
      // The outcome the run reports is the one its answer's class calls for: a 5xx released, a 4xx failed,
      // a 2xx completed (or, for either of those, fenced out or unrecorded, as it went at the store).
      if (result.kind === 'executed') {
        const { status } = result.value
        const allowed = status >= 500 ? ['released'] : [status >= 400 ? 'failed' : 'completed', 'fenced_out', 'unrecorded']
        if (!allowed.includes(result.outcome))
          history.violation(`a run of ${tenant}/${key} answered ${status} and reported the outcome ${JSON.stringify(result.outcome)}`)
      }
      if (result.kind === 'replayed') return answer(result.value.status, result.value.text, { 'idempotent-replayed': 'true' })
      if (result.kind === 'mismatch') return answer(422, '{"error":"key reused with another request"}')
      if (result.kind === 'in_progress')
        return answer(409, '{"error":"in progress"}', { 'retry-after': String(Math.ceil(result.retryAfterMs / 1_000)) })
      if (result.outcome === 'fenced_out') return answer(409, '{"error":"FENCED_OUT"}')
      return answer(result.value.status, result.value.text)
    }
    /**
     * Every error a request ends with is one the simulated faults explain: the bank or the network down
     * (`NetworkError`), the store out of reach (`STORE_UNAVAILABLE`), a lost lease (`FENCED_OUT`), or, for a
     * value JSON cannot hold, `INVALID_ARGUMENT` (`unstorable`). Anything else (a `TypeError` from the ledger's
     * own code, say) is the code under test failing on correct input.
     */
    const explained = (error: unknown, where: string, unstorable = false): void => {
      const code = error instanceof IdempotencyError ? error.code : undefined
      if (
        !(error instanceof NetworkError) &&
        code !== 'STORE_UNAVAILABLE' &&
        code !== 'FENCED_OUT' &&
        !(unstorable && code === 'INVALID_ARGUMENT')
      )
        history.violation(`${where} failed with an error no fault explains: ${String(error)}`)
    }
    /** The answer to a run that ended with `error` (checked: see {@link explained}). */
    const errorAnswer = (error: unknown, where: string, unstorable = false): HttpResponseLike => {
      explained(error, where, unstorable)
      const code = error instanceof IdempotencyError ? error.code : undefined
      return answer(code === 'STORE_UNAVAILABLE' ? 503 : code === 'FENCED_OUT' ? 409 : 500, JSON.stringify({ error: String(error) }))
    }
    const viaRun = async (req: HttpRequestLike): Promise<HttpResponseLike> => {
      const tenant = String(req.headers['x-tenant'])
      const key = String(req.headers['idempotency-key'])
      const payload = JSON.parse(decoder.decode(await req.body(1_024))) as unknown
      const runOptions = engineOptions.runOptionsOf(req)
      try {
        const result = await ledger.run<Answer>(
          { scope: `${SCOPE_PREFIX}${tenant}`, key, payload },
          async (ctx) => {
            const holder = holderId(ctx.scope, ctx.key, ctx.token)
            try {
              const response = await pay(req, ctx as unknown as IdempotencyContext)
              return { status: response.status, text: decoder.decode(response.body) }
            } finally {
              history.reports.handlerDone.add(holder)
            }
          },
          {
            ...runOptions,
            ...(reconciles ? { reconcile } : {}),
            encode: (value) => ({ status: value.status, headers: {}, body: encoder.encode(value.text) }),
            decode: (response) => ({ status: response.status, text: decoder.decode(response.body) }),
            classify: classOf,
            // What the charge created: the intent, stored with the record (checked at the end of the run).
            resourceId: (value) => (value.status < 300 ? (JSON.parse(value.text) as { intent: string }).intent : null),
          },
        )
        return answerOf(tenant, key, result)
      } catch (error) {
        return errorAnswer(error, `a run of ${tenant}/${key}`)
      }
    }

    /**
     * A third way in, as a queue consumer that drives the run itself: `ledger.begin`, the payments handler,
     * then `finish` or `fail` in the try/catch docs/ledger.md gives, for the keys that end in 7. Now and then
     * its value carries a BigInt (a fee, as a database driver returns a money column), which JSON cannot hold:
     * `finish` must refuse it, say so, report it `unrecorded`, and leave the record held until its lease ends
     * (the `fail` of the catch then does nothing). And now and then it gives `finish` a deadline of its own (an
     * ack timeout) and calls `fail` when it passes: refused while `finish` is under way, a no-op once it threw.
     */
    type Receipt = Answer & { fee?: bigint }
    const viaBegin = async (req: HttpRequestLike): Promise<HttpResponseLike> => {
      const tenant = String(req.headers['x-tenant'])
      const key = String(req.headers['idempotency-key'])
      const payload = JSON.parse(decoder.decode(await req.body(1_024))) as { amount: number }
      let begun: Begun<Receipt>
      try {
        begun = await ledger.begin<Receipt>(
          { scope: `${SCOPE_PREFIX}${tenant}`, key, payload },
          {
            ...engineOptions.runOptionsOf(req),
            ...(reconciles ? { reconcile } : {}),
            encode: (value) => ({ status: value.status, headers: {}, body: encoder.encode(JSON.stringify(value)) }),
            decode: (response) => JSON.parse(decoder.decode(response.body)) as Receipt,
            classify: classOf,
          },
        )
      } catch (error) {
        return errorAnswer(error, `ledger.begin of ${tenant}/${key}`)
      }
      if (begun.kind !== 'acquired') return answerOf(tenant, key, begun as RunResult<Answer>)
      const ctx = begun.context
      const holder = holderId(ctx.scope, ctx.key, ctx.token)
      let finishThrew = false
      try {
        let value: Receipt
        try {
          const response = await pay(req, ctx as unknown as IdempotencyContext)
          value = { status: response.status, text: decoder.decode(response.body) }
        } finally {
          history.reports.handlerDone.add(holder)
        }
        if (value.status < 500) {
          history.finishing.add(holder)
          if (rng.chance(0.25)) {
            value.fee = BigInt(payload.amount)
            history.unstorable.add(holder)
          }
        }
        const finishing = begun.finish(value).catch((error: unknown) => {
          finishThrew = true
          throw error
        })
        if (rng.chance(0.25)) {
          world.at(rng.between(0, 100), proc, () => {
            const threw = finishThrew
            begun.fail(new Error('ack timeout')).then(
              () => {
                if (!threw) history.violation(`${holder} called fail() while finish() was under way, and it was not refused`)
              },
              (error: unknown) => {
                if (threw) history.violation(`${holder} called fail() after finish() threw, and it was refused: ${String(error)}`)
                else if (!(error instanceof IdempotencyError) || error.code !== 'INVALID_ARGUMENT' || !error.message.includes('finish()'))
                  history.violation(`${holder} called fail() while finish() was under way, refused with ${String(error)}`)
              },
            )
          })
        }
        const result = await finishing
        if (history.unstorable.has(holder)) history.violation(`${holder}'s value holds a BigInt, and finish() took it: ${result.kind}`)
        return answerOf(tenant, key, result as RunResult<Answer>)
      } catch (error) {
        if (history.unstorable.has(holder)) {
          // Refused, saying what happened and what to do, with JSON's own error as the cause; reported unrecorded.
          const { message, cause } = error as { message?: unknown; cause?: unknown }
          if (
            !(error instanceof IdempotencyError) ||
            error.code !== 'INVALID_ARGUMENT' ||
            !String(message).includes(`${ctx.scope}/${ctx.key}`) ||
            !String(message).includes('BigInt') ||
            !(cause instanceof TypeError)
          )
            history.violation(`${holder}'s value holds a BigInt, and finish() threw ${String(error)}`)
          if (history.unrecordedStatus.get(holder) !== 'completed')
            history.violation(
              `${holder}'s value could not be recorded, and it was reported unrecorded as ${history.unrecordedStatus.get(holder) ?? 'nothing'}`,
            )
        }
        try {
          await begun.fail(error)
        } catch (refused) {
          history.violation(`${holder}: fail() in the catch around finish() threw ${String(refused)}`)
        }
        return errorAnswer(error, `the consumer of ${tenant}/${key}`, history.unstorable.has(holder))
      }
    }

    const serve = async (req: HttpRequestLike): Promise<HttpResponseLike> => {
      const key = String(req.headers['idempotency-key'])
      if (throughRun(key)) return viaRun(req)
      if (throughBegin(key)) return viaBegin(req)
      const transactional = throughTransaction(key)
      try {
        return await (transactional ? txEngine : engine).handle(req, (ctx) =>
          pay(req, ctx, transactional ? (ctx?.tx as SimTx) : undefined).finally(() => {
            if (ctx) history.reports.handlerDone.add(holderId(ctx.scope, ctx.key, ctx.token))
          }),
        )
      } catch (error) {
        explained(error, `the engine's handling of ${String(req.headers['x-tenant'])}/${key}`)
        return { status: 500, headers: {}, body: encoder.encode(String(error)) }
      }
    }
    // A request that finds its record held waits for the holder (the ledger's `wait`, a second) before it is
    // answered 409 in progress (a process paused or whose clock jumped meanwhile is exempt), and that answer says
    // when to come back: a Retry-After of one or two whole seconds.
    this.handle = async (req) => {
      const startedAtMs = world.now
      const disturbances = proc.disturbances
      const response = await serve(req)
      if (response.status === 409 && /still being processed|in progress/.test(decoder.decode(response.body))) {
        const key = String(req.headers['idempotency-key'])
        const retryAfter = String(response.headers['retry-after'])
        if (retryAfter !== '1' && retryAfter !== '2')
          history.violation(`${req.headers['x-tenant']}/${key} was answered in progress with Retry-After ${retryAfter}`)
        if (proc.disturbances === disturbances && world.now - startedAtMs < WAIT_MS - 1)
          history.violation(
            `${req.headers['x-tenant']}/${key} was answered in progress after ${(world.now - startedAtMs).toFixed(0)}ms, before its wait of ${WAIT_MS}ms`,
          )
      }
      return response
    }
  }
}

export function headerRecord(headers: Headers): Record<string, string> {
  const record: Record<string, string> = {}
  headers.forEach((value, name) => {
    record[name] = value
  })
  return record
}

/** What the client reads of a response's headers: `get`, by any case. */
export class SimHeaders {
  readonly #byName = new Map<string, string>()
  constructor(headers: HttpResponseLike['headers']) {
    for (const name in headers) {
      const value = headers[name] as string | string[]
      // As a fetch Headers reads a repeated header: its values joined.
      this.#byName.set(name.toLowerCase(), Array.isArray(value) ? value.join(', ') : value)
    }
  }
  get(name: string): string | null {
    return this.#byName.get(name.toLowerCase()) ?? null
  }
  has(name: string): boolean {
    return this.#byName.has(name.toLowerCase())
  }
}

/**
 * The response a client receives through the simulated network: what the client and the checks read
 * of a fetch `Response` (status, headers, the body as text, JSON or bytes, a clone), without the
 * streams a real one builds, which cost more than the rest of a simulated request.
 */
export class SimResponse {
  readonly status: number
  readonly ok: boolean
  readonly headers: SimHeaders
  readonly #bytes: Uint8Array
  readonly body: { cancel: () => Promise<void> } | null

  constructor(response: HttpResponseLike) {
    this.status = response.status
    this.ok = response.status >= 200 && response.status < 300
    this.headers = new SimHeaders(response.headers)
    this.#bytes = response.body
    this.body = response.body.byteLength ? { cancel: async () => {} } : null
  }

  async arrayBuffer(): Promise<ArrayBuffer> {
    return this.#bytes.slice().buffer as ArrayBuffer
  }

  async text(): Promise<string> {
    return decoder.decode(this.#bytes)
  }

  async json(): Promise<unknown> {
    return JSON.parse(decoder.decode(this.#bytes))
  }

  clone(): SimResponse {
    return this
  }
}

/** Whether the key `key` is served through `ledger.run` (sim/app.ts, the second way in): the keys ending in 3. */
/** How long a request that finds its record held waits for the holder (the ledger's `wait`). */
export const WAIT_MS = 1_000

export const throughRun = (key: string) => /^key-\d*3$/.test(key)

/** Whether the key `key` is served through `ledger.begin` (sim/app.ts, the third way in): the keys ending in 7. */
export const throughBegin = (key: string) => /^key-\d*7$/.test(key)

/** Whether the app process `id` reconciles: those of the third slot (`app2`, `app2.1`, …), as part of a fleet mid-deploy. */
export const reconciling = (id: string) => id.startsWith('app2')

/**
 * Defect late-complete: the ledger's real complete retry, counting to one lease past the lease's end
 * instead of to shortly before it (src/core/store-calls.ts). Undone by the function returned.
 */
export function completeRetryPastTheLease(): () => void {
  const complete = StoreCalls.prototype.complete
  StoreCalls.prototype.complete = function (this: StoreCalls, scope, key, token, outcome, plan, leaseEndsAtMs) {
    return complete.call(this, scope, key, token, outcome, plan, leaseEndsAtMs + plan.leaseMs)
  }
  return () => {
    StoreCalls.prototype.complete = complete
  }
}

/**
 * Defect fresh-capture: the real step log's now(), uuid(), random() and capture() (src/core/steps.ts) compute
 * anew on every attempt instead of returning the first attempt's values. Undone by the function returned.
 */
export function freshCaptures(): () => void {
  const proto = StepLog.prototype
  const { now, uuid, random, capture } = proto
  // A fresh value on every call, deterministic (a counter): no attempt ever sees another's.
  let fresh = 0
  proto.now = async () => ++fresh
  proto.uuid = async () => `00000000-0000-4000-8000-${String(++fresh).padStart(12, '0')}`
  proto.random = async () => ++fresh / 1e9
  proto.capture = async (_name, fn) => fn()
  return () => Object.assign(proto, { now, uuid, random, capture })
}

/** Defect no-renew: the ledger's renewal never fires (src/core/renewal.ts), so a slow holder loses its lease. */
export function noRenewal(): () => void {
  const fire = Renewal.prototype.fire
  Renewal.prototype.fire = () => {}
  return () => {
    Renewal.prototype.fire = fire
  }
}

/**
 * Defect transient-stored: the ledger's real `Held.finish` (src/core/held.ts) stores a transient answer (a 5xx)
 * as the outcome instead of releasing the record for a retry. Undone by the function returned.
 */
export function transientStored(): () => void {
  const finish = Held.prototype.finish
  Held.prototype.finish = function <T>(this: Held<T>, value: T) {
    const plan = (this as unknown as { plan: { classify: (value: T, response: unknown) => string } }).plan
    const classify = plan.classify
    plan.classify = (v, response) => {
      const classification = classify(v, response)
      return classification === 'transient' ? 'completed' : classification
    }
    return finish.call(this, value) as ReturnType<typeof finish>
  }
  return () => {
    Held.prototype.finish = finish
  }
}

/**
 * Defect untold-end: a run the ledger handed back to the engine (`Held`, src/core/held.ts) never ends its
 * telemetry, as when `endsTelemetry` is not set: a tracing span left open, an in-flight gauge that only grows.
 */
export function untoldEnd(): () => void {
  const { finish, fail } = Held.prototype
  Held.prototype.finish = function <T>(this: Held<T>, value: T) {
    this.endsTelemetry = false
    return finish.call(this, value) as ReturnType<typeof finish>
  }
  Held.prototype.fail = function <T>(this: Held<T>, error: unknown) {
    this.endsTelemetry = false
    return fail.call(this, error)
  }
  return () => Object.assign(Held.prototype, { finish, fail })
}

/**
 * Defects lost-unreported and stored-unreported: the ledger's real `StoreCalls.emit` (src/core/store-calls.ts)
 * drops every event of `type`, as an emission behind a wrong `listens()` would: `lease_lost`, so a holder refused
 * its renewal loses its record without the event operators alert on; or `stored`, so an outcome is stored and
 * never reported to the listener or the telemetry. Undone by the function returned.
 */
export function eventDropped(type: LedgerEvent['type']): () => void {
  return eventsRewritten((event) => (event.type === type ? undefined : event))
}

/**
 * Defect phantom-fence: the ledger's real `StoreCalls.emit` (src/core/store-calls.ts) reports a release as a
 * fence, `fenced_out` where the store refused nothing, as a transactional run that takes every rollback for
 * a stale token would (`reason === 'fenced_out'` made always true): operators then hunt zombies that never
 * were. Undone by the function returned.
 */
export function phantomFence(): () => void {
  return eventsRewritten((event) => (event.type === 'released' ? { ...event, type: 'fenced_out' } : event))
}

/** Patches the real `StoreCalls.emit` to emit `rewrite(event)` instead of each event (nothing when undefined); undone by the function returned. */
function eventsRewritten(rewrite: (event: LedgerEvent) => LedgerEvent | undefined): () => void {
  const emit = StoreCalls.prototype.emit
  StoreCalls.prototype.emit = function (this: StoreCalls, event, plan) {
    const emitted = rewrite(event)
    if (emitted) emit.call(this, emitted, plan)
  }
  return () => {
    StoreCalls.prototype.emit = emit
  }
}

/**
 * Defect unreleased: the ledger's real `StoreCalls.release` (src/core/store-calls.ts) asks the store nothing, as
 * its body emptied (a surviving mutant) would: a transient failure keeps its record until the lease ends, and
 * every retry of it meanwhile is answered 409 in progress. Undone by the function returned.
 */
export function unreleased(): () => void {
  const release = StoreCalls.prototype.release
  StoreCalls.prototype.release = async () => {}
  return () => {
    StoreCalls.prototype.release = release
  }
}

/** What a defect reaches of a `Held` that TypeScript keeps to its class: its store calls, its attempt and its plan. */
type HeldParts = { calls: StoreCalls; attempt: { scope: string; key: string; token: number }; plan: Parameters<StoreCalls['release']>[3] }

/**
 * Defect unstorable-released: a value `Held.finish` cannot encode (src/core/held.ts) is taken for a transient
 * failure: the record is released, so a retry runs the work again at once, and the caller hears "released".
 */
export function unstorableReleased(): () => void {
  const finish = Held.prototype.finish
  Held.prototype.finish = async function <T>(this: Held<T>, value: T) {
    try {
      return await finish.call(this, value)
    } catch (error) {
      if (!(error instanceof IdempotencyError) || error.code !== 'INVALID_ARGUMENT') throw error
      const { calls, attempt, plan } = this as unknown as HeldParts
      await calls.release(attempt.scope, attempt.key, attempt.token, plan)
      return {
        kind: 'executed',
        value,
        token: attempt.token,
        outcome: 'released',
        response: { status: 500, headers: {}, body: new Uint8Array(0) },
      }
    }
  } as typeof finish
  return () => {
    Held.prototype.finish = finish
  }
}

/**
 * Defect tx-steps-outside: the ledger's real step log (src/core/steps.ts) keeps its own recorder inside a
 * transaction, so the steps of a transactional run are recorded outside it: committed at once, before the
 * work's writes and whatever becomes of them. Undone by the function returned.
 */
export function stepsOutsideTransaction(): () => void {
  const useRecorder = StepLog.prototype.useRecorder
  StepLog.prototype.useRecorder = () => {}
  return () => {
    StepLog.prototype.useRecorder = useRecorder
  }
}

/**
 * Defect settle-twice: `Held.fail` (src/core/held.ts) releases the record whatever came before it, as with no
 * guard against a second settle: a `fail` after `finish` (an ack timeout, the catch around both) lets a retry
 * run the work again while, or after, its outcome is stored.
 */
export function settleTwice(): () => void {
  const { finish, fail } = Held.prototype
  const finished = new WeakSet<object>()
  Held.prototype.finish = function <T>(this: Held<T>, value: T) {
    finished.add(this)
    return finish.call(this, value) as ReturnType<typeof finish>
  }
  Held.prototype.fail = async function <T>(this: Held<T>, error: unknown) {
    if (!finished.has(this)) return fail.call(this, error)
    const { calls, attempt, plan } = this as unknown as HeldParts
    await calls.release(attempt.scope, attempt.key, attempt.token, plan)
  }
  return () => Object.assign(Held.prototype, { finish, fail })
}
