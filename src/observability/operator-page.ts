import { timingSafeEqual } from 'node:crypto'
import type { IncomingMessage, ServerResponse } from 'node:http'
import { isIP } from 'node:net'
import type { PgCdcRelay } from '../backends/postgres/postgres-cdc-relay.js'
import { DEFAULT_MAX_LAG_BYTES, slotProblem } from '../backends/postgres/slot-health.js'
import type { DurabilitySummary } from '../core/durability.js'
import { type LeaseEnd, leaseEnds } from '../core/lease-end.js'
import type { IdempotencyStore, RecordStatus, StoredRecord } from '../core/store.js'
import { assertFunctions, assertMethods, assertOptionalPositiveInteger } from '../core/validate.js'
import { IdempotencyError } from '../errors.js'
import type { EngineEvent } from '../http/types.js'
import type { Inbox, InboxFailure } from '../messaging/inbox/types.js'
import { Activity, type ActivitySnapshot } from './activity.js'
import { PAGE_CSS, PAGE_HTML, PAGE_JS } from './operator-assets.js'
import { keyHash } from './recorder.js'

/** Options of {@link operatorPage}. */
export interface OperatorPageOptions {
  /** The store the page reads (read only: it never writes). */
  store: IdempotencyStore
  /**
   * When set, every data request must carry `Authorization: Bearer <token>` (the page asks for it once
   * and keeps it for the tab). Needed to serve clients other than loopback ones.
   */
  token?: string | undefined
  /** Serve clients other than loopback ones without a token (behind your own access control). @default false */
  allowRemote?: boolean
  /**
   * Host names the page answers besides loopback names (`localhost`, `*.localhost`) and IP addresses:
   * the names you reach it by. A request for any other `Host` gets `421`, so a DNS-rebinding page
   * (`http://attacker.test:9090` resolved to 127.0.0.1) cannot read it from the operator's browser.
   * Checked whenever no token is set, and also with one once this is given.
   * @default none
   * @example allowedHosts: ['idemkey-admin.internal']
   */
  allowedHosts?: string[]
  /** Records counted per state at most; a count past it shows as `≥ N`. @default 1000 */
  countLimit?: number
  /** What the charts show. @default a new {@link Activity}, fed by {@link OperatorPage.onEvent} */
  activity?: Activity
  /** Where time comes from (the store's clock, to tell leases that ended). @default Date.now */
  now?: () => number
  /**
   * Inboxes whose oldest kept message ID the page shows (with their retention): how far back each
   * one's dedup window really reaches; and their failing messages, with the attempts recorded against
   * `maxAttempts`. PgInbox, MySqlInbox and SqliteInbox can read both.
   */
  inboxes?: ReadonlyArray<Pick<Inbox<unknown>, 'consumer' | 'retentionMs' | 'oldest' | 'failing'>>
  /**
   * CDC relays (`PgCdcRelay`) whose replication slot the page shows: whether it exists, is read, how
   * much WAL it holds. A slot missing, lost, or lagging more than the relay's `maxLagBytes` (256 MiB
   * when the object has none) is marked, as `ready()` would fail on it.
   */
  relays?: ReadonlyArray<OperatorPageRelay>
  /**
   * What the store's server can lose per failure (`idemkey doctor`'s report), shown as a table: a
   * function such as `cachedDurability(() => redisDurabilityReport(…))` (core/durability.ts and the
   * backends' durability-report readers), so the page asks the server at most once a minute.
   */
  durability?: () => Promise<DurabilitySummary>
}

/** What the page needs of a CDC relay: its `health()` (and, when it has them, its slot name and lag limit). */
export type OperatorPageRelay = Pick<PgCdcRelay, 'health'> & Partial<Pick<PgCdcRelay, 'slot' | 'maxLagBytes'>>

/** A mounted operator page: a Node request handler and the event listener that feeds its charts. */
export interface OperatorPage {
  /**
   * Serves the page and its JSON under whatever path it is mounted at (Express `app.use('/idemkey', page.handler)`,
   * Node `http.createServer(page.handler)`). Calls `next` (when given) for paths it does not serve.
   */
  handler: (req: IncomingMessage, res: ServerResponse, next?: (error?: unknown) => void) => void
  /** Pass to `onEvent` of the ledger or middleware so the charts show traffic. */
  onEvent: (event: EngineEvent) => void
  activity: Activity
}

/** What `/api/summary` answers. */
export interface OperatorSummary {
  generatedAtMs: number
  store: { name: string; up: boolean; error?: string }
  counts: Record<RecordStatus, { count: number; capped: boolean }>
  /**
   * In-progress records whose lease ran out without an outcome or a release, and whose row no open
   * transaction holds: their holder crashed or hung. At most 50.
   */
  stuck: PastLeaseHolder[]
  /**
   * In-progress records past their lease whose row an open transaction holds: the holder runs inside its
   * transaction (`runInTransaction` after its first step, which stops renewing the lease; docs/steps.md).
   * Alive, not stuck: duplicates wait for its commit. At most 50; always empty on stores without
   * transactions (Redis, DynamoDB, memory, SQLite).
   */
  inTransaction: PastLeaseHolder[]
  /** Set when the store could not say which holders run in their transaction: those are listed as stuck. */
  holdersUnchecked?: string
  /**
   * Each inbox given: its retention and oldest kept ID (`null`: none kept, or it cannot tell; `error`: it
   * failed to answer), and its messages with attempts recorded, most first (`inbox.failing()`; none when
   * it cannot tell).
   */
  inboxes: Array<{
    consumer: string
    retentionMs: number | null
    oldest: { messageId: string; processedAtMs: number } | null
    failing: InboxFailure[]
    error?: string
  }>
  /**
   * Each CDC relay given: its slot's state (`null` where a relay that failed to answer left it unknown).
   * `problem` says why `ready()` would fail (`missing`, `lost`, `lagging`), or `unavailable` with `error`.
   */
  relays: Array<{
    slot: string | null
    exists: boolean | null
    active: boolean | null
    lagBytes: number | null
    maxLagBytes: number
    walStatus: string | null
    problem: 'missing' | 'lost' | 'lagging' | 'unavailable' | null
    error?: string
  }>
  /** The store server's durability report (`idemkey doctor`), when `durability` was given; `null` otherwise. */
  durability: DurabilitySummary | null
  activity: ActivitySnapshot
}

/** A holder past its lease, as the summary lists it. */
export interface PastLeaseHolder {
  scope: string
  key: string
  keyHash: string
  token: number
  lockedUntilMs: number
  attempts: number
}

const STATES: RecordStatus[] = ['in_progress', 'completed', 'failed']

/** The summary's rows of the records whose lease ended `end` (at most 50). */
function pastLease(records: readonly StoredRecord[], ends: ReadonlyArray<LeaseEnd | null>, end: LeaseEnd): PastLeaseHolder[] {
  return records
    .filter((_, i) => ends[i] === end)
    .slice(0, 50)
    .map((r) => ({
      scope: r.scope,
      key: r.key,
      keyHash: keyHash(r.scope, r.key),
      token: r.token,
      lockedUntilMs: r.lockedUntilMs as number,
      attempts: r.attempts,
    }))
}

/**
 * A read-only page for operators: records by state, holders past their lease without an outcome,
 * recent mismatches, executed/replayed/409 rates, and a lookup of one record (bodies hidden unless
 * asked for). See docs/observability.md, "Operator page".
 *
 * @example
 * const page = operatorPage({ store })
 * app.use(idempotency({ ledger, onEvent: page.onEvent }))
 * app.use('/idemkey', page.handler)
 */
export function operatorPage(options: OperatorPageOptions): OperatorPage {
  const { store } = options
  assertMethods('operatorPage()', 'store', store ?? null, ['list', 'get'])
  assertFunctions('operatorPage()', { now: options.now })
  assertOptionalPositiveInteger(options.countLimit, 'operatorPage() countLimit')
  const activity = options.activity ?? new Activity()
  const countLimit = options.countLimit ?? 1_000
  const now = options.now ?? Date.now
  if (options.token !== undefined && (typeof options.token !== 'string' || Buffer.byteLength(options.token) < 16)) {
    throw new IdempotencyError(
      'INVALID_OPTION',
      'operatorPage({ token }) needs a token of at least 16 characters; make one with `openssl rand -hex 24`.',
    )
  }
  const token = options.token === undefined ? undefined : Buffer.from(options.token)
  if (
    options.allowedHosts !== undefined &&
    (!Array.isArray(options.allowedHosts) || !options.allowedHosts.every((h) => typeof h === 'string'))
  ) {
    throw new IdempotencyError(
      'INVALID_OPTION',
      "operatorPage({ allowedHosts }) must be a list of host names, e.g. ['idemkey-admin.internal'].",
    )
  }
  // A token already stops a rebinding page (it never has the token): then Host is checked only when asked.
  const allowedHosts = !token || options.allowedHosts !== undefined ? new Set((options.allowedHosts ?? []).map(hostName)) : undefined

  async function summary(): Promise<OperatorSummary> {
    const counts = {} as OperatorSummary['counts']
    const result: OperatorSummary = {
      generatedAtMs: now(),
      store: { name: store.name, up: true },
      counts,
      stuck: [],
      inTransaction: [],
      inboxes: await inboxRows(options.inboxes ?? []),
      relays: await relayRows(options.relays ?? []),
      durability: options.durability ? await options.durability() : null,
      activity: activity.snapshot(),
    }
    try {
      for (const status of STATES) {
        const records = await store.list({ status, limit: status === 'in_progress' ? Math.max(countLimit, 1_000) : countLimit })
        counts[status] = { count: Math.min(records.length, countLimit), capped: records.length >= countLimit }
        if (status === 'in_progress') {
          const { ends, unchecked } = await leaseEnds(store, records, now())
          result.stuck = pastLease(records, ends, 'abandoned')
          result.inTransaction = pastLease(records, ends, 'in_transaction')
          if (unchecked !== undefined) result.holdersUnchecked = unchecked
        }
      }
    } catch (error) {
      result.store = { name: store.name, up: false, error: error instanceof Error ? error.message : String(error) }
    }
    return result
  }

  async function lookup(url: URL): Promise<{ status: number; body: unknown }> {
    const key = url.searchParams.get('key')
    if (!key) return { status: 400, body: { error: 'Give the key to look up: ?key=…&scope=… (scope defaults to "default").' } }
    const scope = url.searchParams.get('scope') || 'default'
    const record = await store.get(scope, key)
    if (!record) return { status: 404, body: { error: `No record for key "${key}" in scope "${scope}" (or it expired).`, scope, key } }
    const { ends } = await leaseEnds(store, [record], now())
    return { status: 200, body: { ...describe(record, url.searchParams.get('bodies') === '1'), leaseEnded: ends[0] ?? null } }
  }

  const handler: OperatorPage['handler'] = (req, res, next) => {
    const url = new URL(req.url ?? '/', 'http://page.invalid')
    const path = url.pathname
    const known = path === '/' || path === '/page.js' || path === '/page.css' || path === '/api/summary' || path === '/api/record'
    if (!known) {
      if (next) return next()
      return reply(res, 404, 'application/json', JSON.stringify({ error: `No page at ${path}.` }))
    }
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      res.setHeader('allow', 'GET, HEAD')
      return reply(res, 405, 'application/json', JSON.stringify({ error: 'The operator page is read only: GET it.' }))
    }
    if (allowedHosts && !hostAllowed(req.headers.host, allowedHosts)) {
      return reply(
        res,
        421,
        'application/json',
        JSON.stringify({
          error: `The operator page answers requests for loopback names (localhost, 127.0.0.1, [::1]) and IP addresses only, not for ${JSON.stringify(req.headers.host)}: a page reached by another name may be a DNS-rebinding attack. If you reach it by that name, add it to allowedHosts (idemkey proxy: --admin-allowed-hosts), and set a token.`,
        }),
      )
    }
    if (!token && !options.allowRemote && !isLoopback(req.socket.remoteAddress)) {
      return reply(
        res,
        403,
        'application/json',
        JSON.stringify({ error: 'The operator page answers loopback clients only. Set a token (or allowRemote) to serve others.' }),
      )
    }
    // A page mounted at /idemkey is reached as /idemkey/: its relative links need the slash.
    const original = (req as IncomingMessage & { originalUrl?: string }).originalUrl
    if (path === '/' && original !== undefined && !original.split('?')[0]?.endsWith('/')) {
      res.statusCode = 308
      res.setHeader('location', `${original.split('?')[0]}/`)
      return void res.end()
    }
    if (path === '/') return reply(res, 200, 'text/html; charset=utf-8', PAGE_HTML)
    if (path === '/page.js') return reply(res, 200, 'text/javascript; charset=utf-8', PAGE_JS)
    if (path === '/page.css') return reply(res, 200, 'text/css; charset=utf-8', PAGE_CSS)
    if (token && !authorized(req.headers.authorization, token)) {
      res.setHeader('www-authenticate', 'Bearer realm="idemkey"')
      return reply(res, 401, 'application/json', JSON.stringify({ error: 'This page needs its bearer token.' }))
    }
    const work = path === '/api/summary' ? summary().then((body) => ({ status: 200, body })) : lookup(url)
    work.then(
      ({ status, body }) => reply(res, status, 'application/json', JSON.stringify(body)),
      (error: unknown) =>
        reply(
          res,
          503,
          'application/json',
          JSON.stringify({ error: `The store did not answer: ${error instanceof Error ? error.message : String(error)}` }),
        ),
    )
  }

  return { handler, onEvent: activity.onEvent, activity }
}

/** The inboxes' rows of the summary; one inbox failing to answer is shown as such, not the whole page. */
async function inboxRows(inboxes: NonNullable<OperatorPageOptions['inboxes']>): Promise<OperatorSummary['inboxes']> {
  return Promise.all(
    inboxes.map(async (inbox) => {
      const row = { consumer: inbox.consumer, retentionMs: inbox.retentionMs ?? null }
      try {
        const [oldest, failing] = await Promise.all([inbox.oldest?.(), inbox.failing?.()])
        return { ...row, oldest: oldest ?? null, failing: failing ?? [] }
      } catch (error) {
        return { ...row, oldest: null, failing: [], error: error instanceof Error ? error.message : String(error) }
      }
    }),
  )
}

/** The relays' rows of the summary; a relay whose health() fails shows the error in its row. */
async function relayRows(relays: ReadonlyArray<OperatorPageRelay>): Promise<OperatorSummary['relays']> {
  return Promise.all(
    relays.map(async (relay) => {
      const maxLagBytes = relay.maxLagBytes ?? DEFAULT_MAX_LAG_BYTES
      try {
        const h = await relay.health()
        const problem = slotProblem(h, maxLagBytes)
        return { slot: h.slot, exists: h.exists, active: h.active, lagBytes: h.lagBytes, maxLagBytes, walStatus: h.walStatus, problem }
      } catch (error) {
        return {
          slot: relay.slot ?? null,
          exists: null,
          active: null,
          lagBytes: null,
          maxLagBytes,
          walStatus: null,
          problem: 'unavailable' as const,
          error: error instanceof Error ? error.message : String(error),
        }
      }
    }),
  )
}

function describe(record: StoredRecord, bodies: boolean) {
  const response = record.response
  return {
    scope: record.scope,
    key: record.key,
    keyHash: keyHash(record.scope, record.key),
    status: record.status,
    token: record.token,
    attempts: record.attempts,
    fingerprint: record.fingerprint,
    resourceId: record.resourceId,
    createdAtMs: record.createdAtMs,
    updatedAtMs: record.updatedAtMs,
    expiresAtMs: record.expiresAtMs,
    lockedUntilMs: record.lockedUntilMs,
    response: response && {
      status: response.status,
      headers: response.headers,
      bodyBytes: response.body.byteLength,
      ...(bodies ? { body: new TextDecoder().decode(response.body) } : {}),
    },
  }
}

function reply(res: ServerResponse, status: number, type: string, body: string): void {
  res.statusCode = status
  res.setHeader('content-type', type)
  res.setHeader('cache-control', 'no-store')
  res.setHeader('x-content-type-options', 'nosniff')
  res.setHeader('referrer-policy', 'no-referrer')
  res.setHeader(
    'content-security-policy',
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; frame-ancestors 'none'; form-action 'none'",
  )
  res.end(body)
}

function authorized(header: string | undefined, token: Buffer): boolean {
  const match = /^Bearer\s+(.+)$/i.exec(header ?? '')
  if (!match) return false
  const given = Buffer.from(match[1] as string)
  return given.byteLength === token.byteLength && timingSafeEqual(given, token)
}

/** The name of a Host value (`Example.test:9090` → `example.test`); an IPv6 literal keeps its brackets. */
function hostName(host: string): string {
  const lower = host.trim().toLowerCase()
  const name = lower.startsWith('[') ? lower.slice(0, lower.indexOf(']') + 1) : lower.replace(/:\d*$/, '')
  return name.endsWith('.') ? name.slice(0, -1) : name
}

/**
 * Whether the page answers a request for `host`: none given (no browser sends none), an IP address (a
 * rebinding page's origin is always a name), a loopback name, or one of `allowed`.
 */
function hostAllowed(host: string | undefined, allowed: Set<string>): boolean {
  if (host === undefined) return true
  const name = hostName(host)
  if (name.startsWith('[') || isIP(name) !== 0) return true
  return name === 'localhost' || name.endsWith('.localhost') || allowed.has(name)
}

/** Whether a peer address is this machine's (IPv4 127/8, ::1, or the IPv4-mapped form). */
export function isLoopback(address: string | undefined): boolean {
  if (!address) return false
  const v4 = address.startsWith('::ffff:') ? address.slice(7) : address
  return v4.startsWith('127.') || address === '::1'
}
