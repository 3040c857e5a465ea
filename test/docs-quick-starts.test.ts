/**
 * Every quick start (docs/quick-starts/*.md) does what its page says: its program type-checks as a fresh
 * strict project would (`tsc --init`'s `strict`, `exactOptionalPropertyTypes`, `noUncheckedIndexedAccess`,
 * `verbatimModuleSyntax`), with `idemkey/*` resolved to this checkout's sources as in
 * test/docs-examples.test.ts; then it runs (with tsx, under the Node running the suite, `idemkey/*` resolved
 * to this checkout's build as an installed package's are) against the
 * local servers its marker names, and the page's last command prints exactly the output the page shows.
 *
 * How a page is read: test/fixtures/docs/quick-starts.ts. A server program gets `PORT` (a free port,
 * written for the reader's `localhost:3000` in the try block), a PostgreSQL one a new database
 * (`DATABASE_URL`), dropped afterwards; what a page leaves on a shared server (its queue, stream or JetStream
 * stream) is removed after it ran. A server or curl that is missing skips the page loudly (a failure under CI).
 * Keep the generated files with IDEMKEY_KEEP_DOCS_EXAMPLES=1.
 */
import { type ChildProcess, spawn } from 'node:child_process'
import { existsSync, mkdirSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs'
import { dirname, join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import amqp from 'amqplib'
import { Redis } from 'ioredis'
import ts from 'typescript'
import { fromRoot, SERVICES } from './fixtures/docs/examples.js'
import { type QuickStart, quickStartFiles, readQuickStart } from './fixtures/docs/quick-starts.js'
import { deleteNatsStreams, freshPostgresDatabase, QUICK_START_STREAMS, removeExamplesDir, sourcePaths } from './helpers/docs-sources.js'

import { freePort, portOpen, serviceSkipReason, toolPath } from './helpers/services.js'

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..')
const RUN_TIMEOUT_MS = 60_000
const MAX_LINES = 40

const files = quickStartFiles(ROOT)
const read = files.map((file) => readQuickStart(ROOT, file))
const quickStarts = read.flatMap((found) => (found.quickStart ? [found.quickStart] : []))

/** What a page leaves on a shared server (it empties it at its start, so a reader can run it again): removed after the run. */
const LEFTOVERS: Record<string, () => Promise<void>> = {
  bullmq: () =>
    withRedis(
      async (redis) =>
        void (await redis.eval("for _, k in ipairs(redis.call('KEYS', ARGV[1])) do redis.call('DEL', k) end", 0, 'bull:payments:*')),
    ),
  'outbox-inbox-redis-streams': () => withRedis(async (redis) => void (await redis.del('orders.created'))),
  'outbox-inbox-rabbitmq': async () => {
    const connection = await amqp.connect('amqp://127.0.0.1:5672')
    try {
      await (await connection.createChannel()).deleteQueue('orders.created')
    } finally {
      await connection.close()
    }
  },
}

async function withRedis(use: (redis: Redis) => Promise<void>): Promise<void> {
  const redis = new Redis(6379, '127.0.0.1', { lazyConnect: true })
  try {
    await redis.connect()
    await use(redis)
  } finally {
    redis.disconnect()
  }
}

/** `idemkey` and `idemkey/<subpath>` → the built ESM file (dist/, kept fresh by test/setup/fresh-build.ts), as a user's install resolves them. */
function builtPaths(): Record<string, string[]> {
  const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as {
    name: string
    exports: Record<string, { import?: { default?: string } }>
  }
  const paths: Record<string, string[]> = {}
  for (const [subpath, target] of Object.entries(pkg.exports)) {
    const file = target.import?.default
    if (file === undefined) continue
    paths[subpath === '.' ? pkg.name : `${pkg.name}/${subpath.slice(2)}`] = [join(ROOT, file)]
  }
  return paths
}

/** A fresh `tsc --init` project's checks, plus Node's types and NestJS's decorators. */
function compilerOptions(paths: Record<string, string[]>) {
  return {
    strict: true,
    exactOptionalPropertyTypes: true,
    noUncheckedIndexedAccess: true,
    verbatimModuleSyntax: true,
    isolatedModules: true,
    moduleDetection: 'force',
    target: 'ES2022',
    module: 'NodeNext',
    moduleResolution: 'NodeNext',
    lib: ['ES2023', 'DOM', 'DOM.Iterable'],
    types: ['node'],
    skipLibCheck: true,
    experimentalDecorators: true,
    emitDecoratorMetadata: true,
    allowImportingTsExtensions: true,
    noEmit: true,
    paths,
  }
}

interface Output {
  code: number | null
  signal: NodeJS.Signals | null
  stdout: string
  stderr: string
  timedOut: boolean
}

function collect(child: ChildProcess, timeoutMs: number): Promise<Output> {
  return new Promise((done) => {
    let stdout = ''
    let stderr = ''
    child.stdout?.on('data', (chunk: Buffer) => (stdout += chunk.toString()))
    child.stderr?.on('data', (chunk: Buffer) => (stderr += chunk.toString()))
    let timedOut = false
    const timer = setTimeout(() => {
      timedOut = true
      child.kill('SIGKILL')
    }, timeoutMs)
    child.on('close', (code, signal) => {
      clearTimeout(timer)
      done({ code, signal, stdout, stderr, timedOut })
    })
  })
}

/** A shell for the page's commands, with this Node first on PATH (so `node` and `npx` are the suite's), in its own process group. */
function shellChild(script: string, cwd: string, env: Record<string, string>): ChildProcess {
  return spawn('bash', ['-e', '-o', 'pipefail', '-c', script], {
    cwd,
    env: { ...process.env, ...env, PATH: `${dirname(process.execPath)}:${join(ROOT, 'node_modules/.bin')}:${process.env.PATH}` },
    stdio: ['ignore', 'pipe', 'pipe'],
    detached: true,
  })
}

function shell(script: string, cwd: string, env: Record<string, string>): Promise<Output> {
  return collect(shellChild(script, cwd, env), RUN_TIMEOUT_MS)
}

/**
 * The page's commands as this run gives them: the reader's ports (3000, the also block's) become the free
 * ones this run listens on, and `npx idemkey` this checkout's bin/idemkey.js (a reader's npx finds the
 * installed package's; here npx would look the name up in the registry).
 */
function localized(script: string, ports: [number, number][]): string {
  let text = script.replaceAll('npx idemkey ', `node ${join(ROOT, 'bin/idemkey.js')} `)
  for (const [page, run] of ports)
    text = text
      .replaceAll(`localhost:${page}`, `localhost:${run}`)
      .replaceAll(`127.0.0.1:${page}`, `127.0.0.1:${run}`)
      .replaceAll(`--port ${page}`, `--port ${run}`)
  return text
}

/** What a terminal shows: no carriage returns, no trailing blanks, no blank last line. */
function shown(text: string): string {
  return text
    .replaceAll('\r', '')
    .split('\n')
    .map((line) => line.trimEnd())
    .join('\n')
    .trim()
}

async function waitForPort(port: number, child: ChildProcess, timeoutMs: number): Promise<boolean> {
  const deadline = Date.now() + timeoutMs
  while (Date.now() < deadline) {
    if (child.exitCode !== null || child.signalCode !== null) return false
    if (await portOpen(port)) return true
    await new Promise((wake) => setTimeout(wake, 100))
  }
  return false
}

describe('docs quick starts', () => {
  let dir = ''
  const diagnostics = new Map<string, string[]>()
  const { paths } = sourcePaths(ROOT)

  beforeAll(async () => {
    const base = join(ROOT, '.docs-examples')
    mkdirSync(base, { recursive: true })
    dir = mkdtempSync(join(base, 'quick-'))
    const programs: string[] = []
    const others: [QuickStart, string][] = []
    for (const quickStart of quickStarts) {
      const cwd = join(dir, quickStart.name)
      mkdirSync(cwd, { recursive: true })
      for (const extra of quickStart.files) {
        mkdirSync(dirname(join(cwd, extra.name)), { recursive: true })
        writeFileSync(join(cwd, extra.name), extra.text)
      }
      mkdirSync(dirname(join(cwd, quickStart.program.file)), { recursive: true })
      writeFileSync(join(cwd, quickStart.program.file), `${quickStart.program.code}\n`)
      programs.push(join(cwd, quickStart.program.file))
      for (const extra of quickStart.files.filter((file) => file.name.endsWith('.ts'))) others.push([quickStart, join(cwd, extra.name)])
      if (quickStart.setup !== undefined) {
        const setup = await shell(quickStart.setup, cwd, { PRISMA_SCHEMA_ENGINE_BINARY: '/bin/true' })
        if (setup.code !== 0) diagnostics.set(quickStart.name, [`setup exited with ${setup.code}:\n${setup.stdout}${setup.stderr}`])
      }
    }
    // Each program's folder is a reader's project, with the tsconfig.json tsx runs it with; this one checks them all.
    for (const quickStart of quickStarts) {
      const options = { ...compilerOptions(builtPaths()), include: undefined }
      writeFileSync(join(dir, quickStart.name, 'tsconfig.json'), JSON.stringify({ compilerOptions: options }, null, 2))
    }
    writeFileSync(
      join(dir, 'tsconfig.json'),
      JSON.stringify({ compilerOptions: compilerOptions(paths), files: [...programs, ...others.map(([, file]) => file)] }, null, 2),
    )
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
    const program = ts.createProgram({ rootNames: config.fileNames, options: config.options })
    quickStarts.forEach((quickStart, index) => {
      const source = program.getSourceFile(programs[index] as string)
      if (!source) throw new Error(`${quickStart.file}: not in the program`)
      const found = [...program.getSyntacticDiagnostics(source), ...program.getSemanticDiagnostics(source)].map((diagnostic) => {
        const text = ts.flattenDiagnosticMessageText(diagnostic.messageText, '\n  ')
        if (!diagnostic.file || diagnostic.start === undefined) return `TS${diagnostic.code}: ${text}`
        const { line, character } = diagnostic.file.getLineAndCharacterOfPosition(diagnostic.start)
        return `${quickStart.file}:${quickStart.program.line + line}:${character + 1} - TS${diagnostic.code}: ${text}`
      })
      diagnostics.set(quickStart.name, [...(diagnostics.get(quickStart.name) ?? []), ...found])
    })
    for (const [quickStart, file] of others) {
      const source = program.getSourceFile(file)
      if (!source) throw new Error(`${file}: not in the program`)
      const found = [...program.getSyntacticDiagnostics(source), ...program.getSemanticDiagnostics(source)].map((diagnostic) => {
        const where =
          diagnostic.file && diagnostic.start !== undefined ? diagnostic.file.getLineAndCharacterOfPosition(diagnostic.start) : undefined
        return `${quickStart.file} (${fromRoot(dir, file)}:${(where?.line ?? 0) + 1}) - TS${diagnostic.code}: ${ts.flattenDiagnosticMessageText(diagnostic.messageText, '\n  ')}`
      })
      diagnostics.set(quickStart.name, [...(diagnostics.get(quickStart.name) ?? []), ...found])
    }
  }, 180_000)

  afterAll(() => removeExamplesDir(dir, 'quick starts'))

  it('reads every quick start, and index.md lists each one', () => {
    expect(read.flatMap((found) => found.problems)).toEqual([])
    expect(quickStarts.length).toBeGreaterThan(0)
    const index = readFileSync(join(ROOT, 'docs/quick-starts/index.md'), 'utf8')
    const listed = [...index.matchAll(/\]\(\.\/([\w-]+)\.md\)/g)].map((match) => match[1])
    expect(listed.sort()).toEqual(quickStarts.map((quickStart) => quickStart.name).sort())
    // Every relative link of the quick starts and of index.md leads to a file.
    const broken = [...files, 'docs/quick-starts/index.md'].flatMap((file) =>
      [...readFileSync(join(ROOT, file), 'utf8').matchAll(/\]\((\.{1,2}\/[^)#\s]+)(?:#[^)]*)?\)/g)]
        .map((match) => match[1] as string)
        .filter((target) => !existsSync(join(ROOT, dirname(file), target)))
        .map((target) => `${file}: ${target}`),
    )
    expect(broken).toEqual([])
  })

  it.each(quickStarts.map((quickStart) => [quickStart.file, quickStart] as const))(
    '%s keeps the form of a quick start',
    (_file, quickStart) => {
      expect(quickStart.lines, `${quickStart.file}: the code block has ${quickStart.lines} lines`).toBeLessThan(MAX_LINES)
      expect(quickStart.install).toMatch(/^npm i idemkey( [@\w./-]+)*$/)
      // The install line names every package the page's code imports (Node's own and idemkey aside).
      const installed = quickStart.install
        .split(' ')
        .slice(2)
        .map((name) => name.replace(/(.)@[^/]*$/, '$1'))
      const code = [quickStart.program.code, ...quickStart.files.map((file) => file.text)].join('\n')
      const imported = [...code.matchAll(/^import .*? from '([^'.][^']*)'/gm)]
        .map((match) =>
          (match[1] as string)
            .split('/')
            .slice(0, (match[1] as string).startsWith('@') ? 2 : 1)
            .join('/'),
        )
        .filter((name) => !name.startsWith('node:') && name !== 'idemkey')
      expect(
        imported.filter((name) => !installed.includes(name)),
        `${quickStart.file}: imported, not in the install line`,
      ).toEqual([])
      const files = [quickStart.program.file, ...quickStart.files.map((file) => file.name)]
      expect(files, `${quickStart.file}: the start block runs a file the page does not give`).toContain(quickStart.startFile)
      // A page that needs a server says how to start one.
      const servers = quickStart.run.filter((service) => service !== 'node')
      if (servers.length > 0) expect(quickStart.server, `${quickStart.file}: no "server" block`).toMatch(/docker run/)
    },
  )

  it.each(quickStarts.map((quickStart) => [quickStart.file, quickStart] as const))('%s type-checks', (_file, quickStart) => {
    expect(diagnostics.get(quickStart.name)).toEqual([])
  })

  for (const quickStart of quickStarts) {
    it.concurrent(`${quickStart.file} runs and prints what the page shows (${quickStart.run.join(', ')})`, async (context) => {
      await runQuickStart(quickStart, join(dir, quickStart.name), context)
    })
  }
})

async function runQuickStart(quickStart: QuickStart, cwd: string, context: { skip: (note?: string) => void }): Promise<void> {
  for (const service of quickStart.run) {
    const server = SERVICES[service]
    if (!server) continue
    const skip = await serviceSkipReason(server.name, server.port)
    if (skip) return context.skip(skip)
  }
  if (/\bcurl\b/.test(quickStart.tryIt ?? '')) {
    const curl = toolPath({
      name: 'curl',
      suite: quickStart.file,
      paths: ['/usr/bin/curl', '/usr/local/bin/curl', '/bin/curl'],
      install: 'apt-get install -y curl',
    })
    if (!curl) return context.skip(`${quickStart.file}: no curl`)
  }
  const env: Record<string, string> = {}
  const cleanups: (() => Promise<void>)[] = []
  try {
    if (quickStart.run.includes('postgres')) {
      const fresh = await freshPostgresDatabase()
      env.DATABASE_URL = fresh.url
      cleanups.push(fresh.drop)
    }
    const leftovers = LEFTOVERS[quickStart.name]
    if (leftovers) cleanups.push(leftovers)
    if (quickStart.run.includes('nats')) {
      const named = [...quickStart.program.code.matchAll(/streams\.add\(\{ name: '([^']+)'/g)].map((match) => match[1] as string)
      expect(QUICK_START_STREAMS, `${quickStart.file}: name its streams in QUICK_START_STREAMS`).toEqual(expect.arrayContaining(named))
      cleanups.push(() => deleteNatsStreams(named))
    }
    const port = await freePort()
    env.PORT = String(port)
    const child = spawn(process.execPath, ['--import', 'tsx', quickStart.startFile], {
      cwd,
      env: { ...process.env, ...env, TSX_TSCONFIG_PATH: join(cwd, 'tsconfig.json') },
      stdio: ['ignore', 'pipe', 'pipe'],
    })
    const program = collect(child, RUN_TIMEOUT_MS)
    let shownOutput: string
    if (quickStart.tryIt === undefined) {
      const result = await program
      const how = result.timedOut ? `did not end within ${RUN_TIMEOUT_MS} ms` : `exited with ${result.code ?? result.signal}`
      expect(result.code, `${quickStart.file}: the program ${how}:\n${result.stdout}${result.stderr}`).toBe(0)
      shownOutput = result.stdout
    } else {
      const listening = await waitForPort(port, child, RUN_TIMEOUT_MS)
      if (!listening) {
        child.kill('SIGKILL')
        const result = await program
        throw new Error(`${quickStart.file}: the server never listened on PORT=${port}:\n${result.stdout}${result.stderr}`)
      }
      let also: { child: ChildProcess; output: Promise<Output> } | undefined
      const ports: [number, number][] = [[3000, port]]
      if (quickStart.also) {
        const alsoPort = await freePort()
        ports.push([quickStart.also.port, alsoPort])
        const started = shellChild(localized(quickStart.also.command, ports), cwd, env)
        also = { child: started, output: collect(started, RUN_TIMEOUT_MS) }
        if (!(await waitForPort(alsoPort, started, RUN_TIMEOUT_MS))) {
          child.kill('SIGKILL')
          const result = await also.output
          throw new Error(`${quickStart.file}: the also block never listened on ${alsoPort}:\n${result.stdout}${result.stderr}`)
        }
      }
      const tried = await shell(localized(quickStart.tryIt, ports), cwd, env)
      child.kill('SIGTERM')
      if (also?.child.pid !== undefined) process.kill(-also.child.pid, 'SIGTERM')
      await also?.output
      const server = await program
      expect(
        tried.code,
        `${quickStart.file}: the try block exited with ${tried.code}:\n${tried.stdout}${tried.stderr}\nserver:\n${server.stdout}${server.stderr}`,
      ).toBe(0)
      shownOutput = tried.stdout
    }
    expect(shown(shownOutput), `${fromRoot(ROOT, join(ROOT, quickStart.file))}: the output differs from the page's`).toBe(
      shown(quickStart.expect),
    )
  } finally {
    for (const cleanup of cleanups.reverse()) await cleanup()
  }
}
