/**
 * The documentation site: `npm run docs:build`'s two steps (TypeDoc's API pages, then VitePress) build
 * docs/ once, a plain static server serves the build on loopback, and Debian's Chromium (driven by
 * playwright-core) reads it as a newcomer would: the home page, a quick start, a diagram drawn as SVG,
 * the API page of `Ledger`, and the local search. Every request the pages make stays on the server:
 * the site fetches no font, script or style from the network.
 *
 * Beside it, without a browser: every symbol a public subpath exports carries a doc comment (what the
 * API reference shows).
 */
import { execFile } from 'node:child_process'
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs'
import { createServer, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import { extname, join, resolve } from 'node:path'
import { promisify } from 'node:util'
import { type Browser, chromium, type Page } from 'playwright-core'
import ts from 'typescript'
import { pageTitle } from '../docs/.vitepress/sidebar.js'
import { toolPath } from './helpers/services.js'

const ROOT = resolve(import.meta.dirname, '..')
const DOCS = join(ROOT, 'docs')
const DIST = join(DOCS, '.vitepress', 'dist')
const run = promisify(execFile)

/** Where Debian's chromium package puts the browser; CHROMIUM_PATH overrides. */
const executablePath = toolPath({
  name: 'chromium',
  suite: 'documentation site browser test',
  paths: [process.env.CHROMIUM_PATH, '/usr/bin/chromium', '/usr/bin/chromium-browser'],
  install: 'apt-get install -y chromium, or set CHROMIUM_PATH',
})

const TYPES: Record<string, string> = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript',
  '.css': 'text/css',
  '.json': 'application/json',
  '.svg': 'image/svg+xml',
  '.woff2': 'font/woff2',
  '.png': 'image/png',
}

/** A static server for the build, with VitePress's clean URLs (`/ledger` is ledger.html). */
function serveBuild(): Promise<Server> {
  const server = createServer((req, res) => {
    const path = decodeURIComponent(new URL(req.url ?? '/', 'http://x').pathname)
    const base = join(DIST, path)
    const candidates = [base, `${base}.html`, join(base, 'index.html')]
    const file = base.startsWith(DIST) ? candidates.find((c) => existsSync(c) && statSync(c).isFile()) : undefined
    if (!file) {
      res.writeHead(404, { 'content-type': 'text/html' }).end(readFileSync(join(DIST, '404.html')))
      return
    }
    res.writeHead(200, { 'content-type': TYPES[extname(file)] ?? 'application/octet-stream' }).end(readFileSync(file))
  })
  return new Promise((done) => server.listen(0, '127.0.0.1', () => done(server)))
}

/** The quick start for Express, when the quick starts exist (another change writes them). */
function expressQuickStart(): string | undefined {
  const dir = join(DOCS, 'quick-starts')
  if (!existsSync(dir)) return undefined
  const name = readdirSync(dir).find((file) => file.endsWith('.md') && file.includes('express'))
  return name && join(dir, name)
}

describe.skipIf(!executablePath)('documentation site in headless Chromium', () => {
  let browser: Browser
  let server: Server
  let origin: string
  let page: Page
  /** Every URL the pages asked for, to show that none left the local server. */
  const requested: string[] = []
  /** What the site's Mermaid component said in the console (a failed draw says why). */
  const diagramLog: string[] = []

  beforeAll(async () => {
    // What `npm run docs:build` runs, on this Node.js (the test runs on a supported one).
    const bin = (path: string) => join(ROOT, 'node_modules', path)
    await run(process.execPath, [bin('typedoc/bin/typedoc')], { cwd: ROOT, maxBuffer: 64 << 20 })
    await run(process.execPath, [bin('vitepress/bin/vitepress.js'), 'build', 'docs'], { cwd: ROOT, maxBuffer: 64 << 20 })
    server = await serveBuild()
    origin = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
    browser = await chromium.launch({ executablePath, args: ['--no-sandbox', '--disable-gpu'] })
    page = await browser.newPage()
    page.on('console', (message) => {
      if (message.text().startsWith('idemkey docs:')) diagramLog.push(`${page.url()}: ${message.text()}`)
    })
    page.on('request', (request) => {
      requested.push(request.url())
    })
  }, 900_000)

  afterAll(async () => {
    await browser?.close()
    await new Promise((done) => (server ? server.close(done) : done(undefined)))
  })

  it('the home page says what idemkey is, gives the two commands, and switches to dark mode', async () => {
    await page.goto(`${origin}/`)
    await expect(page.locator('.VPHero .name').textContent()).resolves.toContain('idemkey')
    const body = (await page.locator('.VPContent').textContent()) ?? ''
    expect(body).toContain('npx idemkey demo')
    expect(body).toContain('npm test')
    await expect(page.locator('.VPContent a[href="/api/"]').count()).resolves.toBeGreaterThan(0)
    const dark = () => page.evaluate(() => document.documentElement.classList.contains('dark'))
    const before = await dark()
    await page.locator('.VPNavBar .VPSwitchAppearance').first().click()
    await expect.poll(dark).toBe(!before)
  })

  const quickStart = expressQuickStart()
  if (!quickStart) console.warn('\n!!! docs/quick-starts/ has no Express quick start yet: its page is not checked\n')
  it.skipIf(!quickStart)('the Express quick start is a page of the site, listed in the sidebar under Quick starts', async () => {
    const file = quickStart as string
    const path = `/quick-starts/${file.split('/').pop()?.replace(/\.md$/, '')}`
    await page.goto(`${origin}${path}`)
    await expect(page.locator('.vp-doc h1').first().textContent()).resolves.toContain(pageTitle(file))
    const group = page.locator('.VPSidebar .VPSidebarItem.level-0', { hasText: 'Quick starts' })
    await expect(group.locator(`a[href="${path}"]`).count()).resolves.toBe(1)
  })

  it('a Mermaid diagram in a page is drawn as SVG', async () => {
    await page.goto(`${origin}/ledger`)
    const svg = page.locator('.mermaid svg').first()
    await svg.waitFor({ state: 'visible', timeout: 30_000 })
    // A drawn diagram has shapes, not the source text.
    await expect(svg.locator('g').count()).resolves.toBeGreaterThan(3)
  })

  it("every Mermaid block of the docs pages is drawn, none as Mermaid's syntax-error picture", async () => {
    const pages = readdirSync(DOCS).filter((file) => file.endsWith('.md'))
    const drawn: Record<string, number> = {}
    const expected: Record<string, number> = {}
    for (const file of pages) {
      const blocks = readFileSync(join(DOCS, file), 'utf8').match(/^```mermaid$/gm)?.length ?? 0
      if (blocks === 0) continue
      expected[file] = blocks
      await page.goto(`${origin}/${file.replace(/\.md$/, '')}`)
      const svgs = page.locator('.mermaid svg')
      const shown = () => page.locator('.mermaid svg, .mermaid-source').count()
      await expect.poll(shown, { timeout: 30_000, message: `${file}: ${diagramLog.join('\n')}` }).toBeGreaterThanOrEqual(blocks)
      const why = `${file}: ${diagramLog.join('\n')}`
      await expect(page.locator('.mermaid-source').count(), why).resolves.toBe(0)
      await expect(page.locator('.mermaid svg[aria-roledescription="error"]').count(), why).resolves.toBe(0)
      drawn[file] = await page.locator('.mermaid svg').count()
    }
    // The benchmark page has its charts on top of its own blocks (none today): at least as many.
    expect(Object.keys(expected).length).toBeGreaterThanOrEqual(4)
    for (const file of Object.keys(expected)) expect(drawn[file], file).toBeGreaterThanOrEqual(expected[file] as number)
  })

  it('the benchmark page draws its key tables as charts beside them', async () => {
    await page.goto(`${origin}/benchmarks`)
    const charts = page.locator('.mermaid svg')
    await charts.first().waitFor({ state: 'visible', timeout: 30_000 })
    await expect.poll(() => charts.count()).toBeGreaterThanOrEqual(4)
    // The first chart's bars are the first table's 16-caller cycles/s: MemoryStore's is the largest.
    await expect(page.locator('.mermaid').first().textContent()).resolves.toContain('MemoryStore')
  })

  it("the API reference has Ledger's page, generated from its doc comment with its example", async () => {
    await page.goto(`${origin}/api/index/classes/Ledger`)
    await expect(page.locator('.vp-doc h1').first().textContent()).resolves.toContain('Ledger')
    const text = (await page.locator('.vp-doc').textContent()) ?? ''
    expect(text).toContain('new Ledger(')
    expect(text).toContain('lease')
  })

  it('searching for "lease" finds the ledger page', async () => {
    await page.goto(`${origin}/`)
    await page.locator('.VPNavBarSearch button').click()
    await page.locator('.VPLocalSearchBox input').fill('lease')
    const results = page.locator('.VPLocalSearchBox .results a')
    await results.first().waitFor({ timeout: 30_000 })
    const hrefs = await results.evaluateAll((links) => links.map((link) => link.getAttribute('href') ?? ''))
    expect(hrefs.some((href) => /^\/ledger(#|$)/.test(href))).toBe(true)
  })

  it('no page asked for anything beyond the local server (no font, script or style from a CDN)', () => {
    expect(requested.length).toBeGreaterThan(0)
    expect(requested.filter((url) => !url.startsWith(origin) && !url.startsWith('data:'))).toEqual([])
  })
})

describe('API reference coverage', () => {
  it('every symbol a public subpath exports has a doc comment', () => {
    // One module per public subpath of "exports" (the publishers/* aliases name the broker modules again).
    const exports = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')).exports as Record<string, unknown>
    const files = Object.entries(exports)
      .filter(([subpath, target]) => typeof target === 'object' && !subpath.startsWith('./publishers/'))
      .map(([, target]) => (target as { import: { types: string } }).import.types)
      .map((types) => join(ROOT, types.replace(/^\.\/dist\//, 'src/').replace(/\.d\.ts$/, '.ts')))
    const config = ts.readConfigFile(join(ROOT, 'tsconfig.build.json'), ts.sys.readFile)
    const options = ts.parseJsonConfigFileContent(config.config, ts.sys, ROOT).options
    const program = ts.createProgram(files, { ...options, noEmit: true })
    const checker = program.getTypeChecker()
    const undocumented: string[] = []
    for (const file of files) {
      const source = program.getSourceFile(file)
      const module = source && checker.getSymbolAtLocation(source)
      if (!module) throw new Error(`no module for ${file}`)
      for (const exported of checker.getExportsOfModule(module)) {
        const symbol = exported.flags & ts.SymbolFlags.Alias ? checker.getAliasedSymbol(exported) : exported
        const documented =
          symbol.getDocumentationComment(checker).some((part) => part.text.trim() !== '') ||
          (symbol.declarations ?? []).some((d) => ts.getJSDocCommentsAndTags(d).length > 0)
        if (!documented) undocumented.push(`${file.slice(ROOT.length + 1)}: ${exported.name}`)
      }
    }
    expect(files.length).toBeGreaterThan(30)
    expect(undocumented).toEqual([])
  })
})
