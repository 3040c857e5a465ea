/**
 * Every TypeScript example in README.md and docs/**.md type-checks against this repository's source,
 * and the runnable ones run: the docs cannot drift from the API.
 *
 * How an example is checked (see test/fixtures/docs/examples.ts for the markers):
 * - each ```ts block becomes a module in .docs-examples/run-…/ (inside the repository, so node_modules
 *   resolves), with the free names its marker lists (`given=`) imported from test/fixtures/docs/world/;
 * - a generated tsconfig.json maps `idemkey` and every `idemkey/*` subpath of package.json's `exports`
 *   (read now, so a new subpath is covered as soon as it is exported) to its file under src/, and
 *   checks with `strict` on, as a user's project would;
 * - blocks marked `run=…` are also run with tsx (`node --import tsx`, the same paths) against the local
 *   servers they name, and must exit 0 within RUN_TIMEOUT_MS. A server that is down skips them loudly
 *   (a failure under CI=true). Each run starts from nothing: PostgreSQL examples get a new database
 *   (DATABASE_URL), MySQL examples a new MariaDB database (MYSQL_URL), both dropped afterwards, and the
 *   JetStream streams a run creates are deleted after it.
 *
 * Keep a copy of the generated files with IDEMKEY_KEEP_DOCS_EXAMPLES=1.
 */
import { spawn } from 'node:child_process'
import { mkdirSync, mkdtempSync, writeFileSync } from 'node:fs'
import { dirname, join, relative, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import ts from 'typescript'
import {
  type DocExample,
  docFiles,
  exampleFileName,
  exampleModule,
  extractExamples,
  fromRoot,
  SERVICES,
  sourcePosition,
  WORLD_DIR,
} from './fixtures/docs/examples.js'
import { deleteNewNatsStreams, freshMysqlDatabase, freshPostgresDatabase, removeExamplesDir, sourcePaths } from './helpers/docs-sources.js'

import { serviceSkipReason } from './helpers/services.js'

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..')
const WORLD = join(ROOT, WORLD_DIR)
const RUN_TIMEOUT_MS = 30_000

const { examples, problems } = extractExamples(ROOT, docFiles(ROOT))
const checked = examples.filter((example) => example.skip === undefined)
const runnable = checked.filter((example) => example.run !== undefined)

/** What a user's strict project looks like; decorators as NestJS needs them. */
function compilerOptions(paths: Record<string, string[]>) {
  return {
    strict: true,
    target: 'ES2022',
    module: 'NodeNext',
    moduleResolution: 'NodeNext',
    lib: ['ES2023', 'DOM', 'DOM.Iterable'],
    types: ['node'],
    skipLibCheck: true,
    esModuleInterop: true,
    isolatedModules: true,
    experimentalDecorators: true,
    emitDecoratorMetadata: true,
    noEmit: true,
    paths,
  }
}

function formatDiagnostic(example: DocExample, diagnostic: ts.Diagnostic): string {
  const text = ts.flattenDiagnosticMessageText(diagnostic.messageText, '\n  ')
  if (!diagnostic.file || diagnostic.start === undefined) return `${example.id}: TS${diagnostic.code}: ${text}`
  const { line, character } = diagnostic.file.getLineAndCharacterOfPosition(diagnostic.start)
  const file = resolve(diagnostic.file.fileName)
  if (file.startsWith(WORLD)) return `${fromRoot(ROOT, file)}:${line + 1}:${character + 1} - TS${diagnostic.code}: ${text}`
  return `${sourcePosition(example, line, character)} - TS${diagnostic.code}: ${text}`
}

interface RunResult {
  code: number | null
  signal: NodeJS.Signals | null
  output: string
  timedOut: boolean
}

function runExample(file: string, cwd: string, tsconfig: string, env: Record<string, string>): Promise<RunResult> {
  return new Promise((done) => {
    const child = spawn(process.execPath, ['--import', 'tsx', file], {
      cwd,
      env: { ...process.env, ...env, TSX_TSCONFIG_PATH: tsconfig },
      stdio: ['ignore', 'pipe', 'pipe'],
    })
    let output = ''
    child.stdout.on('data', (chunk: Buffer) => (output += chunk.toString()))
    child.stderr.on('data', (chunk: Buffer) => (output += chunk.toString()))
    let timedOut = false
    const timer = setTimeout(() => {
      timedOut = true
      child.kill('SIGKILL')
    }, RUN_TIMEOUT_MS)
    child.on('close', (code, signal) => {
      clearTimeout(timer)
      done({ code, signal, output, timedOut })
    })
  })
}

describe('docs examples', () => {
  let dir = ''
  const diagnostics = new Map<string, string[]>()
  const { paths, missing } = sourcePaths(ROOT)

  beforeAll(() => {
    const base = join(ROOT, '.docs-examples')
    mkdirSync(base, { recursive: true })
    dir = mkdtempSync(join(base, 'run-'))
    const world = relative(dir, WORLD).split('\\').join('/')
    const files = checked.map((example) => {
      const file = join(dir, exampleFileName(example))
      writeFileSync(file, exampleModule(example, world))
      return file
    })
    writeFileSync(join(dir, 'tsconfig.json'), JSON.stringify({ compilerOptions: compilerOptions(paths), files }, null, 2))
    const config = ts.getParsedCommandLineOfConfigFile(
      join(dir, 'tsconfig.json'),
      {},
      {
        ...ts.sys,
        onUnRecoverableConfigFileDiagnostic: (diagnostic) => {
          throw new Error(ts.flattenDiagnosticMessageText(diagnostic.messageText, '\n'))
        },
      },
    )
    if (!config) throw new Error('the generated tsconfig.json could not be read')
    if (config.errors.length > 0) throw new Error(config.errors.map((d) => ts.flattenDiagnosticMessageText(d.messageText, '\n')).join('\n'))
    const program = ts.createProgram({ rootNames: config.fileNames, options: config.options })
    const global = [...program.getOptionsDiagnostics(), ...program.getGlobalDiagnostics()]
    if (global.length > 0) throw new Error(global.map((d) => ts.flattenDiagnosticMessageText(d.messageText, '\n')).join('\n'))
    checked.forEach((example, index) => {
      const source = program.getSourceFile(files[index] as string)
      if (!source) throw new Error(`${example.id}: not in the program`)
      const found = [...program.getSyntacticDiagnostics(source), ...program.getSemanticDiagnostics(source)]
      diagnostics.set(
        example.id,
        found.map((diagnostic) => formatDiagnostic(example, diagnostic)),
      )
    })
    // The worlds are the reader's code: they must type-check too (reported with the examples that use them).
    for (const source of program.getSourceFiles()) {
      if (!resolve(source.fileName).startsWith(WORLD)) continue
      const found = program.getSemanticDiagnostics(source)
      const users = checked.filter((example) => example.given.length > 0 && source.fileName.endsWith(`/${example.world}.ts`))
      for (const example of users) diagnostics.get(example.id)?.push(...found.map((d) => formatDiagnostic(example, d)))
    }
  }, 180_000) // type-checking every example: past the 60 s hook timeout on a loaded 2-core host, beside docs-quick-starts

  afterAll(() => removeExamplesDir(dir, 'docs examples'))

  it('finds the examples, and every marker is well-formed (each skip states its reason)', () => {
    expect(problems).toEqual([])
    expect(examples.length).toBeGreaterThan(20)
    for (const example of examples.filter((e) => e.skip !== undefined)) console.warn(`docs example skipped: ${example.id}: ${example.skip}`)
  })

  it('reads the markers, and reports each malformed one with its place', () => {
    const file = fromRoot(ROOT, join(dir, 'markers.md'))
    const fence = '```'
    writeFileSync(
      join(ROOT, file),
      [
        '<!-- docs-example: world=fastify given=app,ledger run=node,postgres -->',
        `${fence}ts`,
        'app.get()',
        fence,
        '<!-- docs-example: skip="shows a type, not a program" -->',
        '',
        `${fence}typescript`,
        fence,
        '<!-- docs-example: skip="" -->',
        `${fence}ts`,
        fence,
        '<!-- docs-example: given=1st colour=red -->',
        `${fence}ts`,
        fence,
        '<!-- docs-example: run=oracle -->',
        'Some prose in between.',
        `${fence}ts`,
        fence,
        '<!-- docs-example: given=a -->',
        `${fence}sh`,
        fence,
        '  <!-- docs-example: world=mysql given=store -->',
        `  ${fence}ts`,
        '  await store.purgeExpired(1)',
        `  ${fence}`,
        '<!-- docs-example: world=nowhere given=a -->',
        `${fence}ts`,
        fence,
        '<!-- docs-example: given=a -->',
      ].join('\n'),
    )
    const { examples: found, problems: reported } = extractExamples(ROOT, [file])
    expect(
      found.map(({ id, firstLine, indent, code, given, world, run, skip }) => ({ id, firstLine, indent, code, given, world, run, skip })),
    ).toEqual([
      {
        id: `${file}:2`,
        firstLine: 3,
        indent: 0,
        code: 'app.get()',
        given: ['app', 'ledger'],
        world: 'fastify',
        run: ['node', 'postgres'],
        skip: undefined,
      },
      {
        id: `${file}:7`,
        firstLine: 8,
        indent: 0,
        code: '',
        given: [],
        world: 'common',
        run: undefined,
        skip: 'shows a type, not a program',
      },
      { id: `${file}:10`, firstLine: 11, indent: 0, code: '', given: [], world: 'common', run: undefined, skip: '' },
      { id: `${file}:13`, firstLine: 14, indent: 0, code: '', given: ['1st'], world: 'common', run: undefined, skip: undefined },
      { id: `${file}:17`, firstLine: 18, indent: 0, code: '', given: [], world: 'common', run: undefined, skip: undefined },
      {
        id: `${file}:23`,
        firstLine: 24,
        indent: 2,
        code: 'await store.purgeExpired(1)',
        given: ['store'],
        world: 'mysql',
        run: undefined,
        skip: undefined,
      },
      { id: `${file}:27`, firstLine: 28, indent: 0, code: '', given: ['a'], world: 'nowhere', run: undefined, skip: undefined },
    ])
    expect(reported).toEqual([
      `${file}:9: skip needs a reason: skip="why this example cannot be checked"`,
      `${file}:12: given=1st: "1st" is not a name`,
      `${file}:12: unknown key "colour" (known: given, world, run, skip)`,
      `${file}:15: a docs-example marker must be the last non-blank line before the code block`,
      `${file}:19: a docs-example marker before a \`sh\` block (only ts and typescript blocks are checked)`,
      `${file}:26: world=nowhere: there is no ${WORLD_DIR}/nowhere.ts`,
      `${file}:29: a docs-example marker not followed by a code block`,
    ])
  })

  it("maps every subpath of package.json's exports to a source file", () => {
    expect(missing).toEqual([])
  })

  it.each(checked.map((example) => [example.id, example] as const))('%s type-checks', (_id, example) => {
    expect(diagnostics.get(example.id)).toEqual([])
  })

  for (const example of runnable) {
    it(`${example.id} runs (${example.run?.join(', ')})`, async (context) => {
      const env: Record<string, string> = {}
      for (const service of example.run ?? []) {
        const server = SERVICES[service]
        if (!server) continue
        const skip = await serviceSkipReason(server.name, server.port)
        if (skip) return context.skip(skip)
      }
      // Each run starts from nothing, so an example that forgets to create what it needs fails every time.
      const cleanups: (() => Promise<void>)[] = []
      try {
        if (example.run?.includes('postgres')) {
          const fresh = await freshPostgresDatabase()
          env.DATABASE_URL = fresh.url
          cleanups.push(fresh.drop)
        }
        if (example.run?.includes('mysql')) {
          const fresh = await freshMysqlDatabase()
          env.MYSQL_URL = fresh.url
          cleanups.push(fresh.drop)
        }
        if (example.run?.includes('nats')) cleanups.push(await deleteNewNatsStreams())
        const cwd = mkdtempSync(join(dir, 'cwd-'))
        const result = await runExample(join(dir, exampleFileName(example)), cwd, join(dir, 'tsconfig.json'), env)
        const how = result.timedOut ? `did not end within ${RUN_TIMEOUT_MS} ms` : `exited with ${result.code ?? result.signal}`
        expect(result.code, `${example.id} ${how}:\n${result.output}`).toBe(0)
      } finally {
        for (const cleanup of cleanups.reverse()) await cleanup()
      }
    })
  }
})
