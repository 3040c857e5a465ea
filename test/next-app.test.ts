/**
 * A real Next.js app (test/fixtures/next-app) built with `next build` and served by `next start`, with
 * the packed idemkey tarball installed as a user installs it: a route handler wrapped by idemkey/fetch
 * and a server action wrapped by idemkey/next, both on the embedded SQLite store, no idemkey-specific
 * Next.js settings. Checked over HTTP against the production server: a retried or concurrent POST with
 * one Idempotency-Key runs once and gets the first response; the key with another body is refused; a
 * form submitted twice from one render (posted as the browser posts it without JavaScript: multipart,
 * with React's $ACTION_ID_ field) runs its action once, and a new render runs it again.
 *
 * Next.js, React and TypeScript come from the npm cache after the first run (`--prefer-offline`);
 * telemetry is off. About a minute on the 2-core machine, most of it `next build`.
 */
import { type ChildProcess, spawn } from 'node:child_process'
import { cpSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs'
import { rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import { childEnv, ensureBuilt, run, show } from './helpers/packed.js'
import { freePort } from './helpers/services.js'

const ROOT = join(import.meta.dirname, '..')
/** The Next.js and React the app is built with: bumped on purpose. */
const NEXT = { next: '16.4.6', react: '19.3.1', 'react-dom': '19.3.1', '@types/react': '19.3.0' }
const installed = (name: string) =>
  (JSON.parse(readFileSync(join(ROOT, 'node_modules', name, 'package.json'), 'utf8')) as { version: string }).version

const work = mkdtempSync(join(tmpdir(), 'idemkey-next-'))
const app = join(work, 'app')
const env = { NEXT_TELEMETRY_DISABLED: '1', IDEMKEY_NEXT_DB: join(work, 'idemkey.db') }
let server: ChildProcess | undefined
let base = ''
let serverLog = ''

beforeAll(async () => {
  await ensureBuilt()
  const pack = await run('npm', ['pack', '--ignore-scripts', '--json', '--pack-destination', work], ROOT)
  if (pack.code !== 0) throw new Error(`npm pack failed\n${show(pack)}`)
  const tarball = join(work, (JSON.parse(pack.stdout) as Array<{ filename: string }>)[0]?.filename as string)
  cpSync(join(ROOT, 'test/fixtures/next-app'), app, { recursive: true })
  writeFileSync(join(app, 'package.json'), `${JSON.stringify({ name: 'next-consumer', version: '1.0.0', private: true }, null, 2)}\n`)
  const specs = [
    tarball,
    ...Object.entries(NEXT).map(([name, version]) => `${name}@${version}`),
    `typescript@${installed('typescript')}`,
    `@types/node@${installed('@types/node')}`,
  ]
  const install = await run('npm', ['install', '--no-audit', '--no-fund', '--prefer-offline', ...specs], app, { timeoutMs: 300_000 })
  if (install.code !== 0) throw new Error(`npm install in the Next.js app failed\n${show(install)}`)
  const build = await run('npx', ['--no', '--', 'next', 'build'], app, { env, timeoutMs: 300_000 })
  if (build.code !== 0) throw new Error(`next build failed\n${show(build)}`)

  const port = await freePort()
  base = `http://127.0.0.1:${port}`
  server = spawn('npx', ['--no', '--', 'next', 'start', '--port', String(port), '--hostname', '127.0.0.1'], {
    cwd: app,
    env: childEnv(env),
    stdio: ['ignore', 'pipe', 'pipe'],
    detached: true,
  })
  server.stdout?.on('data', (chunk) => (serverLog += chunk))
  server.stderr?.on('data', (chunk) => (serverLog += chunk))
  for (let i = 0; ; i++) {
    const up = await fetch(`${base}/api/effects`).then(
      (response) => response.ok,
      () => false,
    )
    if (up) break
    if (i > 300 || server.exitCode !== null) throw new Error(`next start did not answer on ${base}\n${serverLog}`)
    await sleep(100)
  }
}, 900_000)

afterAll(async () => {
  // npx runs next in a child of its own: end the whole group.
  if (server?.pid && server.exitCode === null) process.kill(-server.pid, 'SIGKILL')
  await rm(work, { recursive: true, force: true })
}, 240_000)

const effects = async () => (await (await fetch(`${base}/api/effects`)).json()) as { route?: number; action?: number }

const order = (key: string, sku: string) =>
  fetch(`${base}/api/orders`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'idempotency-key': key },
    body: JSON.stringify({ sku }),
  })

/** The form of the /order page as the server rendered it: every field, hidden ones included. */
async function renderedForm(): Promise<Array<[string, string]>> {
  const html = await (await fetch(`${base}/order`)).text()
  const fields: Array<[string, string]> = []
  for (const [tag] of html.matchAll(/<input\b[^>]*>/g)) {
    const name = /\bname="([^"]*)"/.exec(tag)?.[1]
    const value = /\b(?:value|defaultValue)="([^"]*)"/.exec(tag)?.[1] ?? ''
    if (name !== undefined) fields.push([name.replaceAll('&amp;', '&'), value.replaceAll('&amp;', '&')])
  }
  return fields
}

/** Posts the rendered form back as a browser without JavaScript does (multipart, to the page's URL). */
function submit(fields: Array<[string, string]>): Promise<Response> {
  const form = new FormData()
  for (const [name, value] of fields) form.append(name, value)
  return fetch(`${base}/order`, { method: 'POST', body: form, redirect: 'manual' })
}

describe('a Next.js app built with next build, served by next start', () => {
  it('runs a route handler once for two concurrent POSTs with one Idempotency-Key; both get the first response', async () => {
    const before = (await effects()).route ?? 0
    const [a, b] = await Promise.all([order('next-route-1', 'A-1'), order('next-route-1', 'A-1')])
    expect([a.status, b.status], serverLog).toEqual([201, 201])
    const [bodyA, bodyB] = [await a.json(), await b.json()]
    expect(bodyA).toEqual({ order: before + 1, sku: 'A-1' })
    expect(bodyB).toEqual(bodyA)
    expect([a.headers.get('idempotent-replayed'), b.headers.get('idempotent-replayed')].sort()).toEqual([null, 'true'])
    // A retry later: the stored response, not a second order.
    const retry = await order('next-route-1', 'A-1')
    expect(retry.headers.get('idempotent-replayed')).toBe('true')
    expect(await retry.json()).toEqual(bodyA)
    expect((await effects()).route).toBe(before + 1)
  })

  it('refuses the Idempotency-Key with another body (422) and runs a new key', async () => {
    await order('next-route-2', 'B-1')
    const other = await order('next-route-2', 'B-2')
    expect(other.status).toBe(422)
    const before = (await effects()).route ?? 0
    expect((await order('next-route-3', 'B-2')).status).toBe(201)
    expect((await effects()).route).toBe(before + 1)
  })

  it('runs a server action once when one rendered form is submitted twice at once, and again for a new render', async () => {
    const fields = await renderedForm()
    const names = fields.map(([name]) => name)
    expect(names, 'the rendered form carries the key and the action').toContain('idempotencyKey')
    expect(
      names.some((name) => name.startsWith('$ACTION_ID_')),
      `React's action field in ${names.join(', ')}`,
    ).toBe(true)
    const before = (await effects()).action ?? 0
    const responses = await Promise.all([submit(fields), submit(fields)])
    for (const response of responses) expect(response.status, serverLog).toBeLessThan(400)
    expect((await effects()).action, 'a double submit of one render: one order').toBe(before + 1)
    // Submitted again later (a retry, a back-button resubmit): still one.
    await submit(fields)
    expect((await effects()).action).toBe(before + 1)

    const next = await renderedForm()
    const key = (f: Array<[string, string]>) => f.find(([name]) => name === 'idempotencyKey')?.[1]
    expect(key(next), 'each render makes a new key').not.toBe(key(fields))
    await submit(next)
    expect((await effects()).action, 'a new render: a new order').toBe(before + 2)
  })
})
