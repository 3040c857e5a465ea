// Runs every benchmark (bench/*.bench.ts) one after another, each in its own process, then collects
// their tables (docs/benchmarks/<area>.md) into docs/benchmarks.md. PostgreSQL's 10M-row measurement
// is opt-in (it loads for minutes): run `npx tsx bench/postgres.bench.ts --rows 10000000` for it. The scale
// bench runs here at its small default (10^6 rows, 60 s sustained: a few minutes); its full measurement
// is the command in docs/scale.md.
// Usage: npm run bench [-- area ...]   e.g. npm run bench -- ledger http
//        npm run bench -- --collect-only   (rebuild docs/benchmarks.md from the tables already there)
import { spawnSync } from 'node:child_process'
import { existsSync, readdirSync, readFileSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'

const root = join(import.meta.dirname, '..')
const collectOnly = process.argv.includes('--collect-only')
const only = process.argv.slice(2).filter((arg) => !arg.startsWith('--'))
const order = [
  'ledger',
  'postgres',
  'postgres-throughput',
  'redis',
  'redis-cluster',
  'dynamodb',
  'http',
  'proxy',
  'relay',
  'consumers',
  'mysql-inbox',
  'jobs',
  'orm',
  'record-size',
  'scale',
  'sim',
]
const benches = readdirSync(join(root, 'bench'))
  .filter((name) => name.endsWith('.bench.ts'))
  .map((name) => name.replace(/\.bench\.ts$/, ''))
  .filter((area) => !collectOnly && (only.length === 0 || only.includes(area)))
  .sort((a, b) => (order.indexOf(a) + 1 || 99) - (order.indexOf(b) + 1 || 99))

let failed = 0
for (const area of benches) {
  console.log(`\n=== bench/${area}.bench.ts`)
  const result = spawnSync(process.execPath, ['--import', 'tsx', join(root, 'bench', `${area}.bench.ts`)], { stdio: 'inherit', cwd: root })
  if (result.status !== 0) {
    failed++
    console.error(`bench/${area}.bench.ts failed (exit ${result.status ?? result.signal})`)
  }
}

const dir = join(root, 'docs', 'benchmarks')
const sections = order
  .concat(readdirSync(dir).map((f) => f.replace(/\.md$/, '')))
  .filter((area, i, all) => all.indexOf(area) === i && area !== 'README' && existsSync(join(dir, `${area}.md`)))
  .map((area) => readFileSync(join(dir, `${area}.md`), 'utf8').trim())
writeFileSync(
  join(root, 'docs', 'benchmarks.md'),
  `# Benchmarks\n\nEvery figure below was measured by \`npm run bench\` (or the single command named in its section) on the\nmachine named there. Ratios compare rows measured side by side in the same run; absolute figures move with\nthe machine. Regenerate this page with \`npm run bench\`.\n\n${sections.join('\n\n')}\n`,
)
console.log(`\nwrote docs/benchmarks.md (${sections.length} sections)`)
process.exit(failed ? 1 : 0)
