/**
 * The proxy's scopes as an attacker would probe them: a tenant header named like another source's
 * scope, a scope copied from `idemkey list`, a credential whose scheme is spelled in another case,
 * and a store whose error message would leak its address.
 */
import type { ChildProcess } from 'node:child_process'
import { createHash, randomUUID } from 'node:crypto'
import { mkdtempSync, rmSync } from 'node:fs'
import { createServer, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { runNode } from './helpers/cli.js'
import { BIN, type ProxyProcess, startProxy as startHelper } from './helpers/proxy-process.js'

const children: ChildProcess[] = []
const runs = new Map<string, number>()
let upstream: Server
let upstreamUrl: string
let dir: string

function startProxy(args: string[], env: Record<string, string | undefined> = {}): Promise<ProxyProcess> {
  return startHelper(['--upstream', upstreamUrl, ...args], children, { env })
}

async function post(port: number, key: string, headers: Record<string, string> = {}) {
  const response = await fetch(`http://127.0.0.1:${port}/charges`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'idempotency-key': key, ...headers },
    body: '{"amount":100}',
  })
  return { status: response.status, replayed: response.headers.get('idempotent-replayed'), text: await response.text() }
}

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'idemkey-scopes-'))
  upstream = createServer((req, res) => {
    req.resume()
    req.on('end', () => {
      const key = String(req.headers['idempotency-key'])
      runs.set(key, (runs.get(key) ?? 0) + 1)
      res.writeHead(201, { 'content-type': 'application/json' })
      res.end(JSON.stringify({ run: runs.get(key), tenant: req.headers['x-tenant'] ?? null }))
    })
  })
  await new Promise<void>((resolve) => upstream.listen(0, '127.0.0.1', () => resolve()))
  upstreamUrl = `http://127.0.0.1:${(upstream.address() as AddressInfo).port}`
})

afterAll(async () => {
  for (const child of children) child.kill('SIGKILL')
  upstream.closeAllConnections()
  await new Promise((resolve) => upstream.close(resolve))
  rmSync(dir, { recursive: true, force: true })
})

describe('idemkey proxy scopes', () => {
  it('keeps a tenant header named "public" apart from anonymous callers', async () => {
    const proxy = await startProxy(['--store', 'memory:', '--scope-header', 'X-Tenant'], { IDEMKEY_SCOPE_SECRET: 's' })
    const key = randomUUID()
    expect((await post(proxy.port, key)).status).toBe(201)
    const tenant = await post(proxy.port, key, { 'x-tenant': 'public' })
    expect(tenant.replayed).toBeNull()
    expect(JSON.parse(tenant.text)).toMatchObject({ tenant: 'public', run: 2 })
  })

  it('keeps a header value copied from idemkey list apart from the credential scope it names', async () => {
    const db = join(dir, 'copied.db')
    const proxy = await startProxy(['--store', `sqlite:${db}`, '--scope-header', 'X-Tenant'], { IDEMKEY_SCOPE_SECRET: 's' })
    const key = randomUUID()
    expect((await post(proxy.port, key, { authorization: 'Bearer victim-token' })).status).toBe(201)
    const listed = await runNode([BIN, 'list', '--store', `sqlite:${db}`, '--json'])
    const scope = (JSON.parse(listed.stdout) as Array<{ key: string; scope: string }>).find((r) => r.key === key)?.scope
    expect(scope).toBeTruthy()
    const attacker = await post(proxy.port, key, { 'x-tenant': scope as string })
    expect(attacker.replayed).toBeNull()
    expect(JSON.parse(attacker.text)).toMatchObject({ run: 2 })
  })

  it('keys the credential hash with the deployment secret, and gives Bearer and bearer one scope', async () => {
    const db = join(dir, 'hmac.db')
    const proxy = await startProxy(['--store', `sqlite:${db}`], { IDEMKEY_SCOPE_SECRET: 'deployment-secret' })
    const key = randomUUID()
    const credential = 'Basic YWxpY2U6aHVudGVyMg=='
    expect((await post(proxy.port, key, { authorization: credential })).status).toBe(201)
    const again = await post(proxy.port, key, { authorization: credential.replace('Basic', 'BASIC') })
    expect(again.replayed).toBe('true')
    const listed = await runNode([BIN, 'list', '--store', `sqlite:${db}`, '--json'])
    const scope = (JSON.parse(listed.stdout) as Array<{ key: string; scope: string }>).find((r) => r.key === key)?.scope ?? ''
    // Not the unkeyed SHA-256 an offline dictionary could confirm a password against.
    expect(scope).not.toContain(createHash('sha256').update(credential).digest('hex').slice(0, 32))
    expect(proxy.stderr()).not.toMatch(/IDEMKEY_NO_SCOPE_SECRET/)
  })

  it('warns at start-up when no scope secret is set', async () => {
    const proxy = await startProxy(['--store', 'memory:'], { IDEMKEY_SCOPE_SECRET: undefined })
    await new Promise((resolve) => setTimeout(resolve, 200))
    expect(proxy.stderr()).toMatch(/IDEMKEY_SCOPE_SECRET/)
  })

  it("answers 503 with a generic detail, and logs the store's own error, when the store is unreachable", async () => {
    const proxy = await startProxy(['--store', 'postgres://idemkey_role@127.0.0.1:1/billing'], { IDEMKEY_SCOPE_SECRET: 's' })
    const answer = await post(proxy.port, randomUUID())
    expect(answer.status).toBe(503)
    expect(answer.text).not.toMatch(/127\.0\.0\.1|ECONNREFUSED|idemkey_role|billing|postgres/i)
    for (let i = 0; i < 50 && !/ECONNREFUSED/.test(proxy.stderr()); i++) await new Promise((r) => setTimeout(r, 100))
    expect(proxy.stderr()).toMatch(/ECONNREFUSED/)
  })
})
