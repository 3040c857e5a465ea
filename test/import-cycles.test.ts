/**
 * Imports between the library's modules run one way: no module reaches itself through its imports, and
 * every arrow points down the layers of LAYERS below (core, protocol, the messaging contracts, the
 * backends, the integrations over them, the HTTP engine, the adapters, observability, the entries and
 * the CLI). Every module of src/ has a layer: a new folder fails here until it is ranked. A new cycle or
 * an upward arrow fails with the arrow that makes it. Type-only imports count too: they tie the modules'
 * meanings together the same way, even when the compiler erases them.
 */
import { readdirSync, readFileSync } from 'node:fs'
import { dirname, join, relative, resolve } from 'node:path'

const SRC = join(import.meta.dirname, '..', 'src')

function sources(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true, recursive: true })
    .filter((entry) => entry.isFile() && entry.name.endsWith('.ts') && !/\.test(-d)?\.ts$/.test(entry.name))
    .map((entry) => join(entry.parentPath, entry.name))
}

/** Module -> the modules of src/ it imports (relative specifiers, `.js` resolved to the `.ts` source). */
function graph(): Map<string, string[]> {
  const edges = new Map<string, string[]>()
  for (const file of sources(SRC)) {
    const text = readFileSync(file, 'utf8')
    const targets = new Set<string>()
    // Static imports and re-exports, and dynamic import('./x.js') (a lazy load still ties the two modules).
    const specifiers = [
      ...text.matchAll(/(?:^|\n)\s*(?:import|export)\s[^'"]*?from\s+'(\.{1,2}\/[^']+)'/g),
      ...text.matchAll(/\bimport\(\s*'(\.{1,2}\/[^']+)'\s*\)/g),
    ]
    for (const match of specifiers) {
      const target = resolve(dirname(file), (match[1] as string).replace(/\.js$/, '.ts'))
      if (target.startsWith(SRC)) targets.add(relative(SRC, target))
    }
    edges.set(relative(SRC, file), [...targets])
  }
  return edges
}

/** Strongly connected components of more than one module (Tarjan), each as a list of modules. */
function cycles(edges: Map<string, string[]>): string[][] {
  let index = 0
  const indexOf = new Map<string, number>()
  const low = new Map<string, number>()
  const stack: string[] = []
  const onStack = new Set<string>()
  const found: string[][] = []
  const visit = (node: string) => {
    indexOf.set(node, index)
    low.set(node, index++)
    stack.push(node)
    onStack.add(node)
    for (const next of edges.get(node) ?? []) {
      if (!indexOf.has(next)) {
        visit(next)
        low.set(node, Math.min(low.get(node) as number, low.get(next) as number))
      } else if (onStack.has(next)) low.set(node, Math.min(low.get(node) as number, indexOf.get(next) as number))
    }
    if (low.get(node) === indexOf.get(node)) {
      const component: string[] = []
      let member: string
      do {
        member = stack.pop() as string
        onStack.delete(member)
        component.push(member)
      } while (member !== node)
      if (component.length > 1 || (edges.get(node) ?? []).includes(node)) found.push(component.sort())
    }
  }
  for (const node of edges.keys()) if (!indexOf.has(node)) visit(node)
  return found
}

/**
 * The layers, lowest first: a module may import only from its own layer or those below. Each module
 * of src/ matches exactly one layer's pattern; there is no default, so a new folder is ranked here
 * before its first import is checked.
 */
const LAYERS: Array<{ name: string; modules: RegExp }> = [
  { name: 'core', modules: /^(errors\.ts$|core\/)/ },
  // What the client, the engine, the proxy and the RPC adapters share: the key header, response headers, problems.
  { name: 'protocol', modules: /^protocol\// },
  // What every backend's inbox and outbox implement, broker- and database-neutral; not the subpath entries.
  { name: 'messaging contracts', modules: /^messaging\/(?:(?:inbox|outbox)\/(?!index\.ts$))?[^/]+\.ts$/ },
  { name: 'backends', modules: /^backends\// },
  { name: 'integrations over the ledger', modules: /^(testing|client|orm|jobs)\// },
  // The framework-free engine, each broker's publisher and consumer, and the subpaths that gather every backend's inbox and outbox.
  {
    name: 'engine, brokers and messaging entries',
    modules: /^(http\/[^/]+\.ts$|messaging\/brokers\/|messaging\/(inbox|outbox)\/index\.ts$)/,
  },
  { name: 'adapters', modules: /^(http\/[^/]+\/|rpc\/|lambda\/)/ },
  { name: 'observability', modules: /^observability\// },
  // The package's root entry, the CLI and the demo the CLI runs.
  { name: 'entries and the CLI', modules: /^(index\.ts$|cli\/)/ },
]

/** The rank and name of a module's layer, or `undefined` for a module no layer names. */
function layerOf(module: string): { rank: number; name: string } | undefined {
  const matching = LAYERS.flatMap((layer, rank) => (layer.modules.test(module) ? [{ rank, name: layer.name }] : []))
  if (matching.length > 1) throw new Error(`${module} matches several layers: ${matching.map((layer) => layer.name).join(', ')}`)
  return matching[0]
}

/** Each import that points up, as `from -> to (layer <- layer)`. */
function upwardArrows(edges: Map<string, string[]>): string[] {
  const upward: string[] = []
  for (const [from, targets] of edges) {
    const low = layerOf(from)
    for (const to of targets) {
      const high = layerOf(to)
      if (low && high && high.rank > low.rank) upward.push(`${from} -> ${to} (${low.name} imports ${high.name}, a layer above it)`)
    }
  }
  return upward
}

describe('imports between src/ modules', () => {
  const edges = graph()

  it('finds the modules (the graph is not empty)', () => {
    expect(edges.size).toBeGreaterThan(50)
    expect(edges.get('core/ledger.ts')).toContain('core/clock.ts')
  })

  it('form no cycle', () => {
    expect(cycles(edges)).toEqual([])
  })

  it('each have a layer (a new folder is ranked in LAYERS before it is used)', () => {
    const unranked = [...edges.keys()].filter((module) => layerOf(module) === undefined)
    expect(unranked, 'modules no layer of LAYERS in test/import-cycles.test.ts names').toEqual([])
  })

  it('point down the layers', () => {
    expect(upwardArrows(edges), 'imports that point up a layer').toEqual([])
  })

  it('the layer check fails on an upward arrow and on an unknown folder', () => {
    const fabricated = new Map([
      ['core/ledger.ts', ['core/clock.ts', 'http/engine.ts']],
      ['http/express/index.ts', ['observability/operator-page.ts']],
      ['backends/postgres/postgres-store.ts', ['protocol/response-headers.ts', 'core/store.ts']],
    ])
    expect(upwardArrows(fabricated)).toEqual([
      'core/ledger.ts -> http/engine.ts (core imports engine, brokers and messaging entries, a layer above it)',
      'http/express/index.ts -> observability/operator-page.ts (adapters imports observability, a layer above it)',
    ])
    expect(layerOf('newfolder/thing.ts')).toBeUndefined()
    expect(layerOf('messaging/new-broker/index.ts')).toBeUndefined()
    expect(layerOf('messaging/inbox/types.ts')?.name).toBe('messaging contracts')
    expect(layerOf('messaging/inbox/index.ts')?.name).toBe('engine, brokers and messaging entries')
    expect(layerOf('http/types.ts')?.name).toBe('engine, brokers and messaging entries')
    expect(layerOf('http/hono/index.ts')?.name).toBe('adapters')
  })
})
