/**
 * npm run sim: runs the deterministic simulation over many seeds and checks every invariant on each.
 *
 *   npm run sim                          the CI budget: seeds from 1 until the budget of simulated requests
 *   npm run sim -- --requests 2000000    another budget
 *   npm run sim -- --minutes 30          a soak: seeds until the time is up
 *   npm run sim -- --seed 1234 --trace   replays one run exactly, printing its schedule
 *   npm run sim -- --defect fence        runs with a deliberate defect (fence, renew, reencode, new-key, late-complete): must fail
 *
 * A failing seed is printed with the command that replays it, and shrunk: the same seed with fewer
 * clients and intents, as long as it still fails, so the trace to read is short.
 */
import { parseArgs } from 'node:util'
import { DEFECTS, type Defect, runScenario, type ScenarioOptions } from './scenario.js'

const { values } = parseArgs({
  options: {
    seed: { type: 'string' },
    'first-seed': { type: 'string', default: '1' },
    requests: { type: 'string', default: '300000' },
    minutes: { type: 'string' },
    defect: { type: 'string' },
    trace: { type: 'boolean', default: false },
    clients: { type: 'string' },
    intents: { type: 'string' },
    json: { type: 'boolean', default: false },
  },
})

const defect = values.defect as Defect | undefined
if (defect !== undefined && !DEFECTS.includes(defect)) {
  console.error(`sim: --defect is one of ${DEFECTS.join(', ')}, not ${defect}`)
  process.exit(2)
}
const base: Omit<ScenarioOptions, 'seed'> = {
  ...(values.clients ? { clients: Number(values.clients) } : {}),
  ...(values.intents ? { intentsPerClient: Number(values.intents) } : {}),
  ...(defect ? { defect } : {}),
}

function replayCommand(options: ScenarioOptions): string {
  const flags = [`--seed ${options.seed}`]
  if (options.clients) flags.push(`--clients ${options.clients}`)
  if (options.intentsPerClient) flags.push(`--intents ${options.intentsPerClient}`)
  if (options.defect) flags.push(`--defect ${options.defect}`)
  return `npm run sim -- ${flags.join(' ')} --trace`
}

/** The same seed with fewer clients and intents, while it still fails: a shorter schedule to read. */
async function shrink(options: ScenarioOptions): Promise<ScenarioOptions> {
  const best = { clients: 6, intentsPerClient: 8, ...options }
  for (const next of [
    { clients: 1, intentsPerClient: 1 },
    { clients: 1, intentsPerClient: 2 },
    { clients: 2, intentsPerClient: 2 },
    { clients: 2, intentsPerClient: 4 },
    { clients: 3, intentsPerClient: 4 },
    { clients: 4, intentsPerClient: 6 },
  ]) {
    if (next.clients * next.intentsPerClient >= best.clients * best.intentsPerClient) continue
    const candidate = { ...best, ...next }
    if ((await runScenario(candidate)).violations.length > 0) return candidate
  }
  return best
}

if (values.seed !== undefined) {
  const options = { ...base, seed: Number(values.seed), trace: values.trace }
  const result = await runScenario(options)
  if (values.trace) for (const line of result.trace) console.log(line)
  console.log(
    `seed ${result.seed}: ${result.requests} requests, ${result.intents} intents, ${result.events} events, ${result.simulatedMs.toFixed(0)} ms simulated`,
  )
  for (const v of result.violations) console.log(`  VIOLATION ${v}`)
  process.exit(result.violations.length > 0 ? 1 : 0)
}

// The simulated store network and timeouts make thousands of errors per second and nothing prints
// their stacks; capturing them is a fifth of the run. A replay (--seed) keeps them.
Error.stackTraceLimit = 0
const budget = Number(values.requests)
const deadline = values.minutes ? Date.now() + Number(values.minutes) * 60_000 : undefined
const started = process.cpuUsage()
const startedAt = Date.now()
let passed = 0
let requests = 0
let events = 0
const failures: Array<{ options: ScenarioOptions; violations: string[] }> = []
for (let seed = Number(values['first-seed']); ; seed++) {
  if (deadline ? Date.now() >= deadline : requests >= budget) break
  const options = { ...base, seed }
  const result = await runScenario(options)
  requests += result.requests
  events += result.events
  if (result.violations.length === 0) passed++
  else {
    failures.push({ options, violations: result.violations })
    if (failures.length >= 3) break
  }
}
const cpu = process.cpuUsage(started)
const cpuSeconds = (cpu.user + cpu.system) / 1e6
const summary = {
  passed,
  failed: failures.length,
  requests,
  events,
  cpuSeconds: Number(cpuSeconds.toFixed(1)),
  wallSeconds: Number(((Date.now() - startedAt) / 1000).toFixed(1)),
  requestsPerCpuSecond: Math.round(requests / cpuSeconds),
}
for (const failure of failures) {
  const shrunk = await shrink(failure.options)
  console.log(`\nFAILED seed ${failure.options.seed}${defect ? ` (defect ${defect})` : ''}:`)
  for (const v of failure.violations.slice(0, 5)) console.log(`  ${v}`)
  console.log(`  replay: ${replayCommand(shrunk)}`)
}
if (values.json) console.log(JSON.stringify(summary))
console.log(
  `\nsim: ${passed} passed, ${failures.length} failed; ${requests} simulated requests (${events} events) in ${summary.cpuSeconds} CPU-s, ${summary.requestsPerCpuSecond} requests per CPU-second`,
)
process.exit(failures.length > 0 ? 1 : 0)
