/**
 * The user's path: `npm pack`, then the tarball installed into scratch projects with only what a user
 * would install, and used from ESM, from CommonJS, under four TypeScript module settings, and from the
 * command line (`npx idemkey …`) in a project that has nothing but idemkey (and `pg` for a migrate).
 *
 * Installs come from the npm cache (`--prefer-offline`), with the versions this repo has installed,
 * so the run is quick and needs no network. Nothing idemkey depends on has a native part (the embedded
 * store runs on node:sqlite); test/package-managers.test.ts installs with npm 12 and pnpm on each line.
 *
 * Integrations add what they need beside the tarball in test/fixtures/consumer/extras/<name>.json:
 * `{ "dependencies": { "drizzle-orm": "^1" }, "files": ["test/fixtures/consumer/extras/…/x.ts"] }`;
 * the files (their docs' examples) must type-check there under node16 and bundler resolution.
 *
 * The type checks (publint and attw, the four module settings, the extras) look at the tarball's files
 * and declarations, which no Node.js line changes: `npm run test:runtimes` runs this file on the other
 * lines with IDEMKEY_TYPECHECKS=main-line-only, and they run once, in the main suite.
 */
import { randomBytes } from 'node:crypto'
import { cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, writeFileSync } from 'node:fs'
import { cp, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join, posix } from 'node:path'
import pg from 'pg'
import {
  docFiles,
  exampleFileName,
  exampleModule,
  extractExamples,
  uncheckedSpots,
  WORLD_DIR,
  worldTypeNames,
} from './fixtures/docs/examples.js'
import { ensureBuilt, run, show } from './helpers/packed.js'
import { serviceSkipReason } from './helpers/services.js'

const ROOT = join(import.meta.dirname, '..')
const FIXTURES = join(ROOT, 'test/fixtures/consumer')
const TSC = join(ROOT, 'node_modules/typescript/bin/tsc')
const ATTW = join(ROOT, 'node_modules/@arethetypeswrong/cli/dist/index.js')
const PUBLINT = join(ROOT, 'node_modules/publint/src/cli.js')
const PG_URL = 'postgres://root@127.0.0.1:5432/test'

/** Peer dependencies installed beside idemkey for the import and type checks (the subpaths need them). */
const PEERS = [
  'pg',
  'pg-logical-replication',
  'mysql2',
  'ioredis',
  'express',
  'fastify',
  'hono',
  'koa',
  '@nestjs/common',
  '@nestjs/core',
  'rxjs',
  'reflect-metadata',
  'nats',
  'amqplib',
  'fast-check',
  'bullmq',
  '@trpc/server',
  'drizzle-orm',
  'kysely',
  'knex',
  'typeorm',
  'sequelize',
  'postgres',
  'graphql',
  '@opentelemetry/api',
  '@aws-sdk/client-dynamodb',
  '@types/aws-lambda',
  '@types/node',
  '@types/express',
  '@types/koa',
  '@types/amqplib',
]

/** What the docs examples import beyond the peer dependencies: the tools a user of each page installs. */
const DOCS_TOOLS = [
  '@types/pg',
  '@mikro-orm/core',
  '@mikro-orm/postgresql',
  '@apollo/server',
  '@nestjs/bullmq',
  '@opentelemetry/sdk-trace-base',
  'graphile-worker',
  'graphql-yoga',
  'pg-boss',
  'redis',
  'superjson',
  // docs/guides/testing-your-store.md runs the contract suite under vitest without globals.
  'vitest',
]

interface Packed {
  filename: string
  size: number
  unpackedSize: number
  files: Array<{ path: string; size: number }>
}

const work = mkdtempSync(join(tmpdir(), 'idemkey-consumer-'))
/** Only idemkey installed: the CLI checks. */
const bare = join(work, 'bare')
/** idemkey and every peer dependency: the import and type checks. */
const full = join(work, 'full')
let packed: Packed
let tarball: string
let manifest: { version: string; exports: Record<string, unknown>; [field: string]: unknown }
let subpaths: string[]

function installedVersion(name: string): string {
  return (JSON.parse(readFileSync(join(ROOT, 'node_modules', name, 'package.json'), 'utf8')) as { version: string }).version
}

async function npmInstall(dir: string, specs: string[], env: Record<string, string>): Promise<void> {
  mkdirSync(dir, { recursive: true })
  if (!existsSync(join(dir, 'package.json'))) {
    writeFileSync(
      join(dir, 'package.json'),
      `${JSON.stringify({ name: `consumer-${posix.basename(dir)}`, version: '1.0.0', private: true }, null, 2)}\n`,
    )
  }
  const install = await run('npm', ['install', '--no-audit', '--no-fund', '--prefer-offline', ...specs], dir, { env, timeoutMs: 240_000 })
  if (install.code !== 0) throw new Error(`npm install ${specs.join(' ')} failed in ${dir}\n${show(install)}`)
}

/** `npx idemkey …` in a scratch project, as a user types it. */
const idemkey = (dir: string, ...args: string[]) => run('npx', ['--no', '--', 'idemkey', ...args], dir, { timeoutMs: 90_000 })

const pgSkip = await serviceSkipReason('PostgreSQL', 5432)
/** Set by scripts/test-runtimes.mjs on the other Node.js lines: the type checks run on the main line only. */
const typecheckSkip = process.env.IDEMKEY_TYPECHECKS === 'main-line-only'
const dropTables: string[] = []

beforeAll(async () => {
  await ensureBuilt()
  const pack = await run('npm', ['pack', '--ignore-scripts', '--json', '--pack-destination', work], ROOT)
  if (pack.code !== 0) throw new Error(`npm pack failed\n${show(pack)}`)
  packed = (JSON.parse(pack.stdout) as Packed[])[0] as Packed
  tarball = join(work, packed.filename)
  await Promise.all([
    npmInstall(bare, [tarball], {}),
    npmInstall(full, [tarball, ...[...PEERS, ...DOCS_TOOLS].map((name) => `${name}@${installedVersion(name)}`)], {}),
  ])
  manifest = JSON.parse(readFileSync(join(bare, 'node_modules/idemkey/package.json'), 'utf8')) as typeof manifest
  subpaths = Object.keys(manifest.exports)
    .filter((key) => key !== './package.json')
    .map((key) => (key === '.' ? 'idemkey' : `idemkey/${key.slice(2)}`))
  for (const file of ['load.mjs', 'load.cjs', 'two-copies.mjs']) cpSync(join(FIXTURES, file), join(full, file))
}, 420_000)

afterAll(async () => {
  if (dropTables.length > 0) {
    const client = new pg.Client({ connectionString: PG_URL })
    await client.connect()
    for (const table of dropTables) await client.query(`DROP TABLE IF EXISTS public."${table}"`)
    await client.end()
  }
  // Asynchronously, with time to spare: removing the installed trees takes long on a machine busy with I/O.
  await rm(work, { recursive: true, force: true })
}, 240_000)

describe('the packed tarball', () => {
  it('ships what a user needs: LICENSE, README, CHANGELOG, both builds; no source maps, no sources, no docs', () => {
    const files = new Set(packed.files.map((f) => f.path))
    for (const needed of [
      'LICENSE',
      'README.md',
      'CHANGELOG.md',
      'package.json',
      'bin/idemkey.js',
      'dist/index.js',
      'dist/index.d.ts',
      'dist/cjs/index.js',
      'dist/cjs/index.d.ts',
      'dist/cjs/package.json',
      'dist/cli/main.js',
    ]) {
      expect(files, needed).toContain(needed)
    }
    expect([...files].filter((f) => f.endsWith('.map'))).toEqual([])
    expect([...files].filter((f) => f.startsWith('src/') || /\.test(-d)?\.(js|ts)$/.test(f))).toEqual([])
    // The CLI and the demo are ESM only (the bin runs dist/cli/main.js): no CommonJS copy of them.
    expect([...files].filter((f) => /^dist\/cjs\/(cli|demo)\//.test(f) || f === 'dist/cjs/cli/store-url.js')).toEqual([])
    // The CLI is a command: no subpath exports it, so it ships without declarations.
    expect([...files].filter((f) => f.startsWith('dist/cli/') && f.endsWith('.d.ts'))).toEqual([])
    // The docs live in the repository (npm's page links the README's docs/ links there, through `repository`).
    expect([...files].filter((f) => f.startsWith('docs/'))).toEqual([])
    // Under 500 KB: JavaScript without comments, declarations with them (the doc comments users' editors
    // show) and only where an export reaches them (scripts/prune-declarations.mjs), no docs. About 450 KB.
    expect(packed.size, 'packed size in bytes').toBeLessThan(500_000)
    console.info(`idemkey tarball: ${packed.size} bytes packed, ${packed.unpackedSize} unpacked, ${files.size} files`)
  })

  it('has the fields npm shows: repository, homepage, bugs, license, and the Node range it runs on', () => {
    expect(manifest.license).toBe('MIT')
    expect(manifest.repository).toEqual({ type: 'git', url: 'git+https://github.com/idemkey/idemkey.git' })
    expect(manifest.homepage).toMatch(/^https:\/\/github\.com\/idemkey\/idemkey/)
    expect(manifest.bugs).toMatchObject({ url: 'https://github.com/idemkey/idemkey/issues' })
    // The maintained lines: node:sqlite (the embedded store's driver) is built in from 22.16.
    expect((manifest.engines as { node: string }).node).toBe('>=22.16.0')
    expect(readFileSync(join(bare, 'node_modules/idemkey/LICENSE'), 'utf8')).toMatch(/^MIT License/)
  })

  it("every relative link of the shipped README and CHANGELOG leads to a file of the repository, where npm's page sends it", () => {
    // npm's package page turns a README's relative link into one to the same path in `repository`, so the
    // target must exist in the repository (this checkout), whether or not the tarball ships it.
    const root = ROOT
    const broken: string[] = []
    for (const file of packed.files.map((f) => f.path).filter((f) => f.endsWith('.md'))) {
      const text = readFileSync(join(bare, 'node_modules/idemkey', file), 'utf8')
      for (const [, target] of text.matchAll(/\]\(([^)\s]+)\)/g)) {
        if (!target || /^[a-z]+:/i.test(target) || target.startsWith('#')) continue
        const path = posix.normalize(posix.join(posix.dirname(file), target.split('#')[0] as string))
        if (!existsSync(join(root, path))) broken.push(`${file} -> ${target}`)
      }
    }
    expect(broken).toEqual([])
  })

  it('cites nothing users do not have: no "SPEC §" in shipped docs, type declarations or CLI help', async () => {
    const root = join(bare, 'node_modules/idemkey')
    const citing = packed.files
      .map((f) => f.path)
      .filter((f) => /\.(md|d\.ts)$/.test(f))
      .filter((f) => /SPEC §|SPEC\.md/.test(readFileSync(join(root, f), 'utf8')))
    expect(citing).toEqual([])
    for (const command of ['demo', 'proxy', 'migrate', 'inspect', 'list', 'gc', 'evict']) {
      expect((await idemkey(bare, command, '--help')).stdout, command).not.toMatch(/SPEC/)
    }
  })

  it('passes publint --strict and attw in every resolution mode', { skip: typecheckSkip }, async () => {
    const publint = await run(process.execPath, [PUBLINT, 'run', tarball, '--strict'], work)
    expect(publint.code, show(publint)).toBe(0)
    const attw = await run(process.execPath, [ATTW, tarball, '--format', 'table-flipped'], work)
    expect(attw.code, show(attw)).toBe(0)
  })
})

describe('idemkey in a project with its peer dependencies', () => {
  it('exports the NestJS and Koa adapters beside the others', () => {
    expect(subpaths).toEqual(expect.arrayContaining(['idemkey', 'idemkey/postgres', 'idemkey/nestjs', 'idemkey/koa']))
  })

  it('loads every subpath from ESM (import)', async () => {
    const out = await run(process.execPath, ['load.mjs', ...subpaths], full)
    expect(out.code, show(out)).toBe(0)
    const results = JSON.parse(out.stdout) as Record<string, { ok: boolean; exports?: string[] }>
    expect(Object.entries(results).filter(([, r]) => !r.ok)).toEqual([])
    expect(results.idemkey?.exports).toEqual(expect.arrayContaining(['Ledger', 'IdempotencyError', 'isIdempotencyError']))
  })

  it('loads every subpath from CommonJS (require)', async () => {
    const out = await run(process.execPath, ['load.cjs', ...subpaths], full)
    expect(out.code, show(out)).toBe(0)
    const results = JSON.parse(out.stdout) as Record<string, { ok: boolean; exports?: string[] }>
    expect(Object.entries(results).filter(([, r]) => !r.ok)).toEqual([])
    expect(results.idemkey?.exports).toEqual(expect.arrayContaining(['Ledger', 'IdempotencyError', 'isIdempotencyError']))
    expect(results['idemkey/fastify']?.exports).toEqual(expect.arrayContaining(['idempotency']))
  })

  it('an error from the CommonJS copy is an idemkey error to the ESM copy, and back', async () => {
    const out = await run(process.execPath, ['two-copies.mjs'], full)
    expect(out.code, show(out)).toBe(0)
    expect(JSON.parse(out.stdout)).toEqual({ separateCopies: true, esmSeesCjs: true, cjsSeesEsm: true })
  })

  it('type-checks under node16, nodenext, bundler, and node10 with module commonjs', {
    skip: typecheckSkip,
    timeout: 300_000,
  }, async () => {
    const source = readFileSync(join(FIXTURES, 'consumer.ts.txt'), 'utf8')
    const settings: Array<{ name: string; options: Record<string, unknown>; files: string[] }> = [
      { name: 'node16', options: { module: 'node16', moduleResolution: 'node16' }, files: ['consumer.mts', 'consumer.cts'] },
      { name: 'nodenext', options: { module: 'nodenext', moduleResolution: 'nodenext' }, files: ['consumer.mts', 'consumer.cts'] },
      { name: 'bundler', options: { module: 'esnext', moduleResolution: 'bundler' }, files: ['consumer.ts'] },
      // NestJS's default project: CommonJS output, node10 resolution (no exports map: typesVersions).
      {
        name: 'node10',
        options: { module: 'commonjs', moduleResolution: 'node10', experimentalDecorators: true, emitDecoratorMetadata: true },
        files: ['consumer.ts'],
      },
    ]
    const dir = join(full, 'types')
    mkdirSync(dir, { recursive: true })
    for (const file of ['consumer.mts', 'consumer.cts', 'consumer.ts']) writeFileSync(join(dir, file), source)
    const failures: string[] = []
    await Promise.all(
      settings.map(async ({ name, options, files }) => {
        const config = join(dir, `tsconfig.${name}.json`)
        const compilerOptions = { target: 'es2022', strict: true, noEmit: true, skipLibCheck: false, types: ['node'], ...options }
        writeFileSync(config, JSON.stringify({ compilerOptions, files }, null, 2))
        const out = await run(process.execPath, [TSC, '-p', config, '--pretty', 'false'], dir, { timeoutMs: 280_000 })
        // Checked with skipLibCheck off, so a broken idemkey declaration shows; what other packages'
        // declarations say about each other (e.g. @types/koa against its dependencies) is not ours.
        const ours = `${out.stdout}${out.stderr}`
          .split('\n')
          .filter((line) => /error TS/.test(line) && !/^\.\.\/node_modules\/(?!idemkey\/)/.test(line))
        if (out.code !== 0 && ours.length === 0 && !/error TS/.test(out.stdout)) ours.push(show(out))
        if (ours.length > 0) failures.push(`${name}:\n${ours.join('\n')}`)
      }),
    )
    expect(failures.join('\n')).toBe('')
    // Four full type-checks (library declarations included) at once on two cores.
  })
})

/**
 * Examples expected to fail until another branch lands (each entry names why); the lead empties it.
 * An entry that passes fails the test, so the list cannot outlive its reason.
 */
const DOCS_EXPECTED_TO_FAIL_UNTIL_MERGED: Record<string, string> = {}

/** The TypeScript lines whose `tsc --init` a new user runs: its defaults are what the examples must meet. */
const TYPESCRIPTS = [
  { name: 'TypeScript 5.9', tsc: TSC },
  { name: 'TypeScript 7.0', tsc: join(ROOT, 'node_modules/typescript7/bin/tsc') },
]

describe.skipIf(typecheckSkip)('every docs example in a project made by `tsc --init`, beside the real drivers', () => {
  const { examples } = extractExamples(ROOT, docFiles(ROOT))
  const checked = examples.filter((example) => example.skip === undefined)
  /** Example id → the errors each configuration reported in it (or in the world it imports). */
  const errors = new Map<string, string[]>(checked.map((example) => [example.id, []]))
  const project = join(full, 'docs-project')

  beforeAll(async () => {
    // ESM, as a Node project with top-level await is; the packages resolve from full/node_modules.
    mkdirSync(join(project, 'examples'), { recursive: true })
    writeFileSync(join(project, 'package.json'), '{ "type": "module" }\n')
    cpSync(join(ROOT, WORLD_DIR), join(project, 'world'), { recursive: true })
    const typeNames = worldTypeNames(ROOT)
    const files = checked.map((example) => {
      writeFileSync(join(project, 'examples', exampleFileName(example)), exampleModule(example, '../world', typeNames))
      return `../examples/${exampleFileName(example)}`
    })
    // A user's real objects handed to every idemkey type that takes one (test/fixtures/consumer/strict/).
    cpSync(join(FIXTURES, 'strict'), join(project, 'strict'), { recursive: true })
    files.push(...readdirSync(join(project, 'strict')).map((file) => `../strict/${file}`))
    // A Node.js project that loads only idemkey and its client: no DOM lib, and no package that would bring it in.
    writeFileSync(
      join(project, 'node-only.ts'),
      "import type * as core from 'idemkey'\nimport type * as client from 'idemkey/client'\nexport type { client, core }\n",
    )
    const started = performance.now()
    // One TypeScript line at a time: the suite's other worker shares the two cores, and its timing-bound
    // tests (store models, TCP faults) starved with two more full type-checks beside it.
    for (const { name, tsc } of TYPESCRIPTS) {
      await (async () => {
        const dir = join(project, name.replaceAll(' ', '-'))
        mkdirSync(dir, { recursive: true })
        const init = await run(process.execPath, [tsc, '--init'], dir)
        if (init.code !== 0) throw new Error(`${name}: tsc --init failed\n${show(init)}`)
        // tsc --init's own defaults (strict, exactOptionalPropertyTypes, noUncheckedIndexedAccess,
        // verbatimModuleSyntax, module nodenext), with what its comment says a Node.js project sets
        // (lib esnext, types node: no DOM), and the decorators NestJS asks for.
        // skipLibCheck off only (tsc --init turns it on): it reports every error the default would, in the
        // examples and the real objects, plus any in idemkey's own declarations; a second run with it on
        // could only find fewer.
        const checks = [
          { name: 'skipLibCheck false', skipLibCheck: false, files },
          { name: 'node only', skipLibCheck: false, files: ['../node-only.ts'] },
        ]
        for (const { name: check, skipLibCheck, files } of checks) {
          const config = join(dir, `tsconfig.${check.replaceAll(' ', '-')}.json`)
          const compilerOptions = {
            lib: ['esnext'],
            types: ['node'],
            skipLibCheck,
            experimentalDecorators: true,
            emitDecoratorMetadata: true,
            noEmit: true,
          }
          writeFileSync(config, JSON.stringify({ extends: './tsconfig.json', compilerOptions, files }, null, 2))
          const out = await run(process.execPath, [tsc, '-p', config, '--pretty', 'false'], dir, { timeoutMs: 400_000 })
          const lines = `${out.stdout}${out.stderr}`.split('\n').filter((line) => /error TS/.test(line))
          if (out.code !== 0 && lines.length === 0) throw new Error(`${name}: tsc did not run\n${show(out)}`)
          for (const line of lines) {
            const where = `${name}, ${check}: ${line}`
            const example = /^\.\.\/examples\/([^(]+)\(/.exec(line)?.[1]
            const world = /^\.\.\/world\/([\w-]+)\.ts\(/.exec(line)?.[1]
            if (/^\.\.\/strict\//.test(line)) errors.set('(real objects)', [...(errors.get('(real objects)') ?? []), where])
            else if (example) errors.get(checked.find((e) => exampleFileName(e) === example)?.id ?? '(unknown)')?.push(where)
            else if (world) for (const e of checked.filter((e) => e.world === world && e.given.length > 0)) errors.get(e.id)?.push(where)
            // What other packages' declarations say about each other (skipLibCheck false) is not ours.
            else if (!/^\.\.\/\.\.\/node_modules\/(?!idemkey\/)/.test(line))
              errors.set('(idemkey)', [...(errors.get('(idemkey)') ?? []), where])
          }
        }
      })()
    }
    console.info(
      `docs examples: ${checked.length} files and the real objects, 2 TypeScript lines, skipLibCheck false (and a Node-only check), ${Math.round(performance.now() - started)} ms`,
    )
  }, 900_000)

  it('type-checks with nothing stepped around: no any, no @ts- directive, no cast to a type idemkey should give', () => {
    expect(checked.flatMap((example) => uncheckedSpots(example))).toEqual([])
  })

  it("idemkey's own declarations type-check with skipLibCheck off, in a Node.js project without the DOM lib too", () => {
    expect(errors.get('(idemkey)') ?? []).toEqual([])
  })

  it("takes the user's real objects: pg, mysql2, ioredis, node-redis, postgres.js, ORMs, AWS SDK and @types/aws-lambda, with the transaction typed where the handler gets it", () => {
    expect(errors.get('(real objects)') ?? []).toEqual([])
  })

  it.each(checked.map((example) => [example.id, example] as const))('%s', (id) => {
    const found = errors.get(id) ?? []
    if (id in DOCS_EXPECTED_TO_FAIL_UNTIL_MERGED)
      expect(found, `${id} passes now: remove it from DOCS_EXPECTED_TO_FAIL_UNTIL_MERGED`).not.toEqual([])
    else expect(found).toEqual([])
  })
})

describe('the idemkey command in a project with nothing but idemkey', () => {
  it('--version and --help answer, whatever drivers are missing', async () => {
    const version = await idemkey(bare, '--version')
    expect(version.code, show(version)).toBe(0)
    expect(version.stdout.trim()).toBe(manifest.version)
    const help = await idemkey(bare, '--help')
    expect(help.code, show(help)).toBe(0)
    expect(help.stdout).toMatch(/demo[\s\S]*migrate[\s\S]*gc/)
  })

  it('runs a short demo on the embedded SQLite store', async () => {
    const demo = await idemkey(bare, 'demo', '--intents', '12', '--workers', '1', '--json')
    expect(demo.code, show(demo)).toBe(0)
    const report = JSON.parse(demo.stdout) as { passed: boolean; intents: number; protected: { doubleCharges: number } }
    expect(report).toMatchObject({ passed: true, intents: 12, protected: { doubleCharges: 0 } })
  })

  it('refuses to read or purge a store that does not exist, instead of creating ./idemkey.db', async () => {
    for (const args of [['list'], ['gc'], ['inspect', 'order-1'], ['evict', 'order-1', '--yes']]) {
      const out = await idemkey(bare, ...args)
      expect(out.code, args.join(' ')).not.toBe(0)
      expect(out.stderr, args.join(' ')).toContain('--store')
    }
    expect(existsSync(join(bare, 'idemkey.db'))).toBe(false)
  })

  it('names the missing driver and the npm i line that installs it', async () => {
    for (const [url, driver] of [
      ['redis://127.0.0.1:6379', 'ioredis'],
      ['mysql://root@127.0.0.1:3306/test', 'mysql2'],
      [PG_URL, 'pg'],
    ] as const) {
      const out = await idemkey(bare, 'migrate', '--store', url)
      expect(out.code, url).not.toBe(0)
      expect(out.stderr, url).toContain(`npm i ${driver}`)
      expect(out.stderr, url).not.toMatch(/\n\s+at /) // one line, no stack trace
    }
  })

  it('migrates PostgreSQL with only pg installed beside it', { skip: pgSkip !== undefined }, async () => {
    const withPg = join(work, 'with-pg')
    // Asynchronously: a node_modules tree copied synchronously can block this worker past vitest's RPC deadline.
    await cp(bare, withPg, { recursive: true, verbatimSymlinks: true })
    await npmInstall(withPg, [`pg@${installedVersion('pg')}`], {})
    const table = `consumer_${randomBytes(6).toString('hex')}`
    dropTables.push(table)
    const store = `${PG_URL}?table=${table}`
    const migrate = await idemkey(withPg, 'migrate', '--store', store, '--json')
    expect(migrate.code, show(migrate)).toBe(0)
    expect(JSON.parse(migrate.stdout)).toMatchObject({ result: expect.stringContaining('up to date') })
    const list = await idemkey(withPg, 'list', '--store', store)
    expect(list.code, show(list)).toBe(0)
    expect(list.stdout).toContain('no records match')
  })
})

interface Extra {
  name: string
  /** Packages installed beside the tarball (name -> version range). */
  dependencies: Record<string, string>
  /** Repository-relative TypeScript files (the integration's docs examples) checked in that project. */
  files: string[]
  /**
   * A Prisma schema (repository-relative), copied beside the files and generated with the installed
   * `prisma` before the check (the examples import the client it generates). Offline, the schema engine
   * cannot be downloaded and generating does not use it: any executable stands in (docs/orm.md).
   */
  prismaSchema?: string
}

const EXTRAS_DIR = join(FIXTURES, 'extras')
const extras: Extra[] = existsSync(EXTRAS_DIR)
  ? readdirSync(EXTRAS_DIR)
      .filter((file) => file.endsWith('.json'))
      .map((file) => ({
        name: file.slice(0, -'.json'.length),
        ...(JSON.parse(readFileSync(join(EXTRAS_DIR, file), 'utf8')) as Omit<Extra, 'name'>),
      }))
  : []

describe.skipIf(extras.length === 0 || typecheckSkip)('idemkey beside the tools its integrations adapt', () => {
  it.each(extras.map((extra) => [extra.name, extra] as const))(
    'extras %s: installs beside its tools, and its examples type-check under node16 and bundler resolution',
    async (_name, extra) => {
      const dir = join(work, `extras-${extra.name}`)
      const deps = Object.entries(extra.dependencies).map(([name, range]) => `${name}@${range}`)
      await npmInstall(dir, [tarball, ...deps, `@types/node@${installedVersion('@types/node')}`], {})
      const pkg = JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8')) as Record<string, unknown>
      writeFileSync(join(dir, 'package.json'), `${JSON.stringify({ ...pkg, type: 'module' }, null, 2)}\n`)
      const src = join(dir, 'src')
      mkdirSync(src, { recursive: true })
      const files = extra.files.map((file) => {
        const target = join(src, posix.basename(file))
        cpSync(join(ROOT, file), target)
        return posix.relative(dir, target)
      })
      expect(files.length, 'an extras file lists the examples it checks').toBeGreaterThan(0)
      if (extra.prismaSchema) {
        cpSync(join(ROOT, extra.prismaSchema), join(src, 'schema.prisma'))
        const cli = join(dir, 'node_modules/prisma/build/index.js')
        const generated = await run(process.execPath, [cli, 'generate', '--schema', 'src/schema.prisma'], dir, {
          env: { PRISMA_SCHEMA_ENGINE_BINARY: '/bin/true', PRISMA_HIDE_UPDATE_MESSAGE: '1' },
          timeoutMs: 120_000,
        })
        expect(generated.code, show(generated)).toBe(0)
      }
      const failures: string[] = []
      for (const [name, options] of [
        ['node16', { module: 'node16', moduleResolution: 'node16' }],
        ['bundler', { module: 'esnext', moduleResolution: 'bundler' }],
      ] as const) {
        const config = join(dir, `tsconfig.${name}.json`)
        const compilerOptions = { target: 'es2022', strict: true, noEmit: true, skipLibCheck: true, types: ['node'], ...options }
        writeFileSync(config, JSON.stringify({ compilerOptions, files }, null, 2))
        const out = await run(process.execPath, [TSC, '-p', config, '--pretty', 'false'], dir, { timeoutMs: 280_000 })
        if (out.code !== 0) failures.push(`${name}:\n${show(out)}`)
      }
      expect(failures.join('\n')).toBe('')
    },
    400_000,
  )
})
