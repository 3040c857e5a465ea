/**
 * docs/reference/ says what the code does: every error code, every metric and every option, both ways.
 *
 * - errors.md: the codes of `IdempotencyErrorCode` (read with the TypeScript compiler from src/errors.ts),
 *   their status (`HTTP_STATUS_BY_CODE`), the error classes `src/` raises each with (`new X('CODE'` and
 *   `super('CODE'` of every class built on `IdempotencyError`), and the proxy's own problems
 *   (`proxyProblem(status, 'slug', …)` under src/cli/proxy) with their `Retry-After`.
 * - metrics.md: the instruments an OpenTelemetry SDK collects from real ledger runs through
 *   `openTelemetry()`, and the metrics of the proxy's Prometheus text, with types and attributes.
 * - options.md: generated from the exported `…Options` types of every subpath of package.json's
 *   `exports` (TypeScript compiler API): name, type and `@default` of each property. Regenerate it with
 *   `IDEMKEY_WRITE_REFERENCE=1 node scripts/with-node.mjs npx vitest run test/docs-reference.test.ts`.
 *
 * Each comparison also runs on the page with one row taken out, and must name the row. And every relative
 * link of README.md and docs/ leads to a file and a heading that exist (pages move into guides and reference).
 */
import { existsSync, readdirSync, readFileSync, writeFileSync } from 'node:fs'
import { join, resolve } from 'node:path'
import { AggregationTemporality, DataPointType, MeterProvider, MetricReader } from '@opentelemetry/sdk-metrics'
import ts from 'typescript'
import { describe, expect, it } from 'vitest'
import { MemoryStore } from '../src/backends/memory/index.js'
import { prometheusMetrics } from '../src/cli/proxy/prometheus.js'
import type { IdempotencyStore } from '../src/core/store.js'
import { HTTP_STATUS_BY_CODE } from '../src/errors.js'
import { Ledger } from '../src/index.js'
import { openTelemetry } from '../src/observability/opentelemetry.js'
import { brokenLinks, optionsModel, optionsPage, readOptionsPage } from './fixtures/docs/reference.js'

const ROOT = resolve(import.meta.dirname, '..')
const read = (path: string) => readFileSync(join(ROOT, path), 'utf8')

// ── Markdown tables ────────────────────────────────────────────────────────────────────────────────

/** The cells of a table row; `\|` is a pipe inside a cell. */
function cells(line: string): string[] {
  return line
    .trim()
    .replace(/^\||\|$/g, '')
    .split(/(?<!\\)\|/)
    .map((cell) => cell.trim().replaceAll('\\|', '|'))
}

/** The body rows of every table under the `## heading` (up to the next `## `). */
function tableRows(page: string, heading: string): string[][] {
  const start = page.indexOf(`\n## ${heading}\n`)
  if (start < 0) return []
  const rest = page.slice(start + heading.length + 5)
  const section = rest.slice(0, rest.search(/\n## |$/))
  return section
    .split('\n')
    .filter((line) => line.startsWith('|') && !/^\|\s*-/.test(line))
    .map(cells)
    .filter((row, i, rows) => i > 0 && rows[i - 1] !== undefined && row !== undefined)
    .filter((row) => !['code', 'problem', 'instrument', 'metric', 'option'].includes(row[0] ?? ''))
}

/** The names in backticks in a cell, parenthesised values left out. */
function ticked(cell: string): string[] {
  return [...cell.replace(/\([^)]*\)/g, '').matchAll(/`([^`]+)`/g)].map((m) => m[1] as string)
}

/** The differences between what the code has and what the page says, keyed by row name. */
function compare(what: string, code: Map<string, string>, page: Map<string, string>): string[] {
  const problems: string[] = []
  for (const [name, value] of code) {
    if (!page.has(name)) problems.push(`${what}: ${name} is missing (the code has ${value})`)
    else if (page.get(name) !== value) problems.push(`${what}: ${name} says ${page.get(name)}, the code has ${value}`)
  }
  for (const name of page.keys()) if (!code.has(name)) problems.push(`${what}: ${name} is on the page but not in the code`)
  return problems
}

/** The page without the first table row that mentions `name`: each check must notice it. */
function withoutRow(page: string, name: string): string {
  const lines = page.split('\n')
  const at = lines.findIndex((line) => line.startsWith('|') && line.includes(`\`${name}\``))
  if (at < 0) throw new Error(`no row mentions ${name}`)
  lines.splice(at, 1)
  return lines.join('\n')
}

// ── The code, read with the TypeScript compiler ────────────────────────────────────────────────────

function sourceFiles(dir: string): string[] {
  return readdirSync(join(ROOT, dir), { withFileTypes: true }).flatMap((entry) => {
    const path = `${dir}/${entry.name}`
    if (entry.isDirectory()) return sourceFiles(path)
    return /\.ts$/.test(entry.name) && !/\.test(-d)?\.ts$/.test(entry.name) ? [path] : []
  })
}

function parse(path: string): ts.SourceFile {
  return ts.createSourceFile(path, read(path), ts.ScriptTarget.ES2022, true)
}

function walk(node: ts.Node, visit: (node: ts.Node) => void): void {
  visit(node)
  node.forEachChild((child) => walk(child, visit))
}

/** The members of the `IdempotencyErrorCode` union in src/errors.ts. */
function errorCodes(): string[] {
  const codes: string[] = []
  walk(parse('src/errors.ts'), (node) => {
    if (ts.isTypeAliasDeclaration(node) && node.name.text === 'IdempotencyErrorCode') {
      walk(node.type, (member) => {
        if (ts.isLiteralTypeNode(member) && ts.isStringLiteral(member.literal)) codes.push(member.literal.text)
      })
    }
  })
  return codes
}

/** Code → the error classes src/ raises it with. */
function classesByCode(codes: string[]): Map<string, Set<string>> {
  const files = sourceFiles('src').map(parse)
  const classes = new Set(['IdempotencyError'])
  for (const file of files) {
    walk(file, (node) => {
      if (ts.isClassDeclaration(node) && node.name && node.heritageClauses?.some((h) => /IdempotencyError/.test(h.getText()))) {
        classes.add(node.name.text)
      }
    })
  }
  // A function that returns codes (rejectionCode): `new X(fn(…))` raises each of them.
  const returned = new Map<string, string[]>()
  for (const file of files) {
    walk(file, (node) => {
      if (!ts.isFunctionDeclaration(node) || !node.name || !node.body) return
      const literals: string[] = []
      walk(node.body, (inner) => {
        if (ts.isReturnStatement(inner) && inner.expression) {
          walk(inner.expression, (value) => {
            if (ts.isStringLiteral(value) && codes.includes(value.text)) literals.push(value.text)
          })
        }
      })
      if (literals.length > 0) returned.set(node.name.text, literals)
    })
  }
  const found = new Map<string, Set<string>>(codes.map((code) => [code, new Set<string>()]))
  for (const file of files) {
    walk(file, (node) => {
      let name: string | undefined
      let args: ts.NodeArray<ts.Expression> | undefined
      if (ts.isNewExpression(node) && classes.has(node.expression.getText())) {
        name = node.expression.getText()
        args = node.arguments
      } else if (ts.isCallExpression(node) && node.expression.kind === ts.SyntaxKind.SuperKeyword) {
        const owner = ts.findAncestor(node, ts.isClassDeclaration)
        if (owner?.name && classes.has(owner.name.text)) {
          name = owner.name.text
          args = node.arguments
        }
      }
      const first = args?.[0]
      if (!name || !first) return
      if (ts.isStringLiteral(first) && found.has(first.text)) found.get(first.text)?.add(name)
      // `new X(fn(…))`, or `const code = fn(…)` then `new X(code)`
      let call: ts.Expression | undefined = first
      if (ts.isIdentifier(first)) {
        const scope = ts.findAncestor(node, ts.isFunctionLike)
        walk(scope ?? file, (inner) => {
          if (ts.isVariableDeclaration(inner) && inner.name.getText() === first.text) call = inner.initializer
        })
      }
      if (call && ts.isCallExpression(call)) for (const code of returned.get(call.expression.getText()) ?? []) found.get(code)?.add(name)
    })
  }
  return found
}

/** slug → `status, Retry-After` of every `proxyProblem(...)` call under src/cli/proxy. */
function proxyProblems(): Map<string, string> {
  const found = new Map<string, string>()
  for (const file of sourceFiles('src/cli/proxy').map(parse)) {
    walk(file, (node) => {
      if (!ts.isCallExpression(node) || node.expression.getText() !== 'proxyProblem') return
      const [status, slug, , , retry] = node.arguments
      if (!status || !slug || !ts.isNumericLiteral(status) || !ts.isStringLiteral(slug)) return
      found.set(slug.text, `${status.text}, ${retry?.kind === ts.SyntaxKind.FalseKeyword ? '–' : '1'}`)
    })
  }
  return found
}

// ── errors.md ──────────────────────────────────────────────────────────────────────────────────────

const codes = errorCodes()
const classes = classesByCode(codes)
const proxyProblemsInCode = proxyProblems()

function errorProblems(page: string): string[] {
  const rows = tableRows(page, 'Codes')
  const status = compare(
    'errors.md, status',
    new Map(codes.map((code) => [code, `\`${HTTP_STATUS_BY_CODE[code as keyof typeof HTTP_STATUS_BY_CODE]}\``])),
    new Map(rows.map((row) => [ticked(row[0] ?? '')[0] ?? '', row[2] ?? ''])),
  )
  const classProblems: string[] = []
  for (const row of rows) {
    const code = ticked(row[0] ?? '')[0] ?? ''
    const listed = new Set(ticked(row[1] ?? ''))
    for (const raised of classes.get(code) ?? []) {
      if (!listed.has(raised)) classProblems.push(`errors.md, class: ${code} is raised as ${raised}, which its row does not name`)
    }
    for (const name of listed) {
      if (!classes.get(code)?.has(name)) classProblems.push(`errors.md, class: ${code} names ${name}, which src/ never raises it as`)
    }
  }
  const proxy = compare(
    'errors.md, proxy problems',
    proxyProblemsInCode,
    new Map(
      tableRows(page, 'Problems only `idemkey proxy` answers').map((row) => [
        ticked(row[0] ?? '')[0] ?? '',
        `${ticked(row[1] ?? '')[0]}, ${ticked(row[2] ?? '')[0] ?? '–'}`,
      ]),
    ),
  )
  return [...status, ...classProblems, ...proxy]
}

describe('docs/reference/errors.md', () => {
  it('reads the codes, the classes and the proxy problems from src/', () => {
    expect(codes).toContain('STORE_UNAVAILABLE')
    expect([...(classes.get('REQUEST_REJECTED') ?? [])]).toEqual(['IdempotentRequestError'])
    expect(proxyProblemsInCode.get('bad-target')).toBe('400, –')
  })

  const page = read('docs/reference/errors.md')

  it('lists every error code with its HTTP status and every class src/ raises it as, and the proxy-only problems, and nothing else', () => {
    expect(errorProblems(page)).toEqual([])
  })

  it('notices a code, a class or a proxy problem taken out of the page', () => {
    expect(errorProblems(withoutRow(page, 'RETRIES_EXHAUSTED'))).toContain(
      'errors.md, status: RETRIES_EXHAUSTED is missing (the code has `503`)',
    )
    expect(errorProblems(page.replace('`IdempotencyError`, `InProgressError`', '`IdempotencyError`'))).toContain(
      'errors.md, class: IN_PROGRESS is raised as InProgressError, which its row does not name',
    )
    expect(errorProblems(withoutRow(page, 'too-many-tunnels')).join('\n')).toMatch(/too-many-tunnels is missing/)
  })

  it('links every code and proxy problem it links to a section of docs/errors.md that exists', () => {
    const sections = new Set([...read('docs/errors.md').matchAll(/^## ([a-z-]+)$/gm)].map((m) => m[1]))
    const targets = [...page.matchAll(/\.\.\/errors\.md#([a-z-]+)/g)].map((m) => m[1])
    expect(targets.length).toBeGreaterThan(10)
    expect(targets.filter((slug) => !sections.has(slug))).toEqual([])
  })
})

// ── metrics.md ─────────────────────────────────────────────────────────────────────────────────────

class CollectingReader extends MetricReader {
  constructor() {
    super({ aggregationTemporalitySelector: () => AggregationTemporality.CUMULATIVE })
  }
  protected async onForceFlush(): Promise<void> {}
  protected async onShutdown(): Promise<void> {}
}

/** A memory store whose next acquire fails, for the error metrics. */
function storeFailingOnce(): { store: IdempotencyStore; failNext: () => void } {
  const store = new MemoryStore()
  let fail = false
  const acquire = store.acquire.bind(store)
  store.acquire = (...args: Parameters<typeof acquire>) => {
    if (!fail) return acquire(...args)
    fail = false
    return Promise.reject(new Error('store down'))
  }
  return {
    store,
    failNext: () => {
      fail = true
    },
  }
}

/** Runs that make every instrument record: executed, waited then replayed, a store error. */
async function exercise(ledger: Ledger, failNext: () => void): Promise<void> {
  // The first run holds the key until the second has started waiting for it, then 20 ms more: a wait
  // that ended within the same millisecond would be recorded as none, and the wait histogram left empty.
  let release!: () => void
  let started!: () => void
  const held = new Promise<void>((resolve) => {
    started = resolve
  })
  const first = ledger.run({ key: 'k', payload: 1 }, () => {
    started()
    return new Promise<number>((done) => {
      release = () => done(1)
    })
  })
  await held
  await ledger.run({ key: 'k', payload: 1 }, () => 2, {
    onEvent: (event) => {
      if (event.type === 'waiting') setTimeout(release, 20)
    },
  })
  await first
  failNext()
  await ledger.run({ key: 'other', payload: 1 }, () => 3).catch(() => undefined)
}

/** The page's name of each kind of data an instrument collects (sums are counters or up-down counters). */
const OTEL_TYPES: Record<string, string> = { HISTOGRAM: 'histogram', EXPONENTIAL_HISTOGRAM: 'histogram', GAUGE: 'gauge' }

async function otelInstruments(): Promise<Map<string, string>> {
  const reader = new CollectingReader()
  const { store, failNext } = storeFailingOnce()
  const ledger = new Ledger({
    store,
    lease: '1s',
    telemetry: openTelemetry({ meterProvider: new MeterProvider({ readers: [reader] }), traces: false, store }),
  })
  await exercise(ledger, failNext)
  const { resourceMetrics } = await reader.collect()
  const found = new Map<string, string>()
  for (const metric of resourceMetrics.scopeMetrics.flatMap((scope) => scope.metrics)) {
    const attributes = new Set(metric.dataPoints.flatMap((point) => Object.keys(point.attributes)))
    const type =
      metric.dataPointType === DataPointType.SUM
        ? metric.isMonotonic
          ? 'counter'
          : 'up-down counter'
        : (OTEL_TYPES[DataPointType[metric.dataPointType]] ?? DataPointType[metric.dataPointType])
    found.set(metric.descriptor.name, `${type} | ${metric.descriptor.unit} | ${[...attributes].sort().join(', ')}`)
  }
  return found
}

async function prometheusNames(): Promise<Map<string, string>> {
  const { store, failNext } = storeFailingOnce()
  const metrics = prometheusMetrics({ store })
  await exercise(new Ledger({ store, lease: '1s', telemetry: metrics.telemetry }), failNext)
  metrics.answered('executed', 201, 0.01)
  metrics.unrecorded()
  metrics.storeUp(true)
  const text = await metrics.registry.metrics()
  const found = new Map<string, { type: string; labels: Set<string> }>()
  for (const [, name, type] of text.matchAll(/^# TYPE (\S+) (\S+)$/gm))
    found.set(name as string, { type: type as string, labels: new Set() })
  for (const [, sample, labels] of text.matchAll(/^([a-z_]+)\{([^}]*)\}/gm)) {
    const name = (sample as string).replace(/_(bucket|sum|count)$/, '')
    for (const [, label] of (labels as string).matchAll(/([a-z_]+)="/g)) if (label !== 'le') found.get(name)?.labels.add(label as string)
  }
  return new Map([...found].map(([name, { type, labels }]) => [name, `${type} | ${[...labels].sort().join(', ')}`]))
}

let collected: Promise<[Map<string, string>, Map<string, string>]> | undefined

async function metricProblems(page: string): Promise<string[]> {
  collected ??= Promise.all([otelInstruments(), prometheusNames()])
  const [otel, prometheus] = await collected
  const otelRows = tableRows(page, 'OpenTelemetry instruments')
  const promRows = tableRows(page, "The proxy's Prometheus metrics")
  return [
    ...compare(
      'metrics.md, OpenTelemetry',
      otel,
      new Map(
        otelRows.map((row) => [
          ticked(row[0] ?? '')[0] ?? '',
          `${row[1]} | ${ticked(row[2] ?? '')[0]} | ${ticked(row[3] ?? '')
            .sort()
            .join(', ')}`,
        ]),
      ),
    ),
    ...compare(
      'metrics.md, Prometheus',
      prometheus,
      new Map(
        promRows.map((row) => [
          ticked(row[0] ?? '')[0] ?? '',
          `${row[1]} | ${ticked(row[2] ?? '')
            .sort()
            .join(', ')}`,
        ]),
      ),
    ),
  ]
}

describe('docs/reference/metrics.md', () => {
  const page = read('docs/reference/metrics.md')

  it('lists every instrument openTelemetry() records and every metric of the proxy, with type, unit and attributes, and nothing else', async () => {
    expect(await metricProblems(page)).toEqual([])
  })

  it('notices an instrument, a Prometheus metric or an attribute taken out of the page', async () => {
    expect((await metricProblems(withoutRow(page, 'idemkey.store.errors'))).join('\n')).toMatch(
      /OpenTelemetry: idemkey\.store\.errors is missing/,
    )
    expect((await metricProblems(withoutRow(page, 'idemkey_store_up'))).join('\n')).toMatch(/Prometheus: idemkey_store_up is missing/)
    const noOutcome = page.replace('`db.system.name`, `idemkey.result`, `idemkey.outcome`', '`db.system.name`, `idemkey.result`')
    expect((await metricProblems(noOutcome)).join('\n')).toMatch(/idemkey\.intents says .* the code has .*idemkey\.outcome/)
  })
})

// ── options.md ─────────────────────────────────────────────────────────────────────────────────────

const model = optionsModel(ROOT)

function optionProblems(page: string): string[] {
  const documented = readOptionsPage(page)
  const problems = compare(
    'options.md, types',
    new Map(model.map((type) => [type.name, type.subpath])),
    new Map([...documented.keys()].map((name) => [name, model.find((type) => type.name === name)?.subpath ?? '?'])),
  )
  for (const type of model) {
    const doc = documented.get(type.name)
    if (!doc) continue
    problems.push(
      ...compare(`options.md, ${type.name}`, new Map(type.rows.map((row) => [row.name, `${row.type} ‖ ${row.default}`])), doc.rows),
      ...compare(
        `options.md, ${type.name}, also`,
        new Map([...type.also].map(([from, except]) => [from, except.join(', ')])),
        new Map([...doc.also].map(([from, except]) => [from, except.join(', ')])),
      ),
    )
    if ((type.oneOf ?? []).join() !== (doc.oneOf ?? []).join()) {
      problems.push(`options.md, ${type.name}: one of ${doc.oneOf?.join(', ')}, the code has ${type.oneOf?.join(', ')}`)
    }
  }
  return problems
}

describe('docs/reference/options.md', () => {
  if (process.env.IDEMKEY_WRITE_REFERENCE === '1') writeFileSync(join(ROOT, 'docs/reference/options.md'), optionsPage(model))
  const page = read('docs/reference/options.md')

  it('reads the options types of every public subpath', () => {
    const names = model.map((type) => type.name)
    expect(names).toEqual(expect.arrayContaining(['LedgerOptions', 'PostgresStoreUrlOptions', 'EngineOptions', 'OutboxRelayOptions']))
    const ledger = model.find((type) => type.name === 'LedgerOptions')
    expect(ledger?.rows.map((row) => row.name)).toContain('lease')
  })

  it('lists every option of every public options type with its type and documented default, and nothing else', () => {
    expect(optionProblems(page)).toEqual([])
  })

  it('notices an option taken out, a default changed, or a type taken out', () => {
    const lease = model.find((type) => type.name === 'LedgerOptions')?.rows.find((row) => row.name === 'lease')
    const lines = page.split('\n')
    const at = lines.findIndex(
      (line, i) =>
        line.startsWith('| `lease` |') &&
        lines
          .slice(0, i)
          .reverse()
          .find((l) => l.startsWith('### '))
          ?.includes('LedgerOptions'),
    )
    expect(optionProblems([...lines.slice(0, at), ...lines.slice(at + 1)].join('\n'))).toContain(
      `options.md, LedgerOptions: lease is missing (the code has ${lease?.type} ‖ ${lease?.default})`,
    )
    lines[at] = (lines[at] as string).replace(` ${lease?.default} |`, ' 1 year |')
    expect(optionProblems(lines.join('\n')).join('\n')).toMatch(/LedgerOptions: lease says .*1 year/)
    expect(optionProblems(page.replace('### `MemoryStoreOptions`', '### `Gone`'))).toContain(
      'options.md, types: MemoryStoreOptions is missing (the code has idemkey/memory)',
    )
  })
})

// ── Links ──────────────────────────────────────────────────────────────────────────────────────────

function docsPages(): Map<string, string> {
  const walkDocs = (dir: string): string[] =>
    readdirSync(join(ROOT, dir), { withFileTypes: true }).flatMap((entry) =>
      entry.isDirectory() ? walkDocs(`${dir}/${entry.name}`) : entry.name.endsWith('.md') ? [`${dir}/${entry.name}`] : [],
    )
  return new Map(['README.md', ...walkDocs('docs')].map((path) => [path, read(path)]))
}

describe('links between the docs', () => {
  const exists = (path: string) => existsSync(join(ROOT, path))

  it('every relative link of README.md and docs/ leads to a file, and to a heading of it when it names one', () => {
    expect(brokenLinks(docsPages(), exists, read)).toEqual([])
  })

  it('notices a link to a heading that moved away, and to a page that is not there', () => {
    const pages = new Map([['docs/steps.md', '[alerts](observability.md#alerts-worth-paging-on) [gone](guides/nowhere.md)']])
    expect(brokenLinks(pages, exists, read)).toEqual([
      'docs/steps.md: observability.md#alerts-worth-paging-on: docs/observability.md has no heading #alerts-worth-paging-on',
      'docs/steps.md: guides/nowhere.md: there is no docs/guides/nowhere.md',
    ])
  })
})
