/**
 * Imports between the library's modules run one way: no module reaches itself through its imports, and
 * the layers point down (core <- the messaging contracts <- backends, testing, client <- http, messaging, observability, lambda <- cli, demo). A new cycle or an upward arrow
 * fails here with the path that makes it. Type-only imports count too: they tie the modules' meanings
 * together the same way, even when the compiler erases them.
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

/** The layer of a module, lowest first: a module may import only from its own layer or those below. */
const LAYERS: Array<[RegExp, number]> = [
  [/^(errors|core\/)/, 0],
  // What every backend's inbox and outbox implement: broker- and database-neutral.
  [/^messaging\/(message|dispatcher|consumer-options|inbox\/types|outbox\/(storage|relay))\.ts$/, 1],
  [/^(backends\/|testing\/|client\/|orm\/)/, 2],
  [/^(http\/|messaging\/|observability\/|lambda\/)/, 3],
  [/^(cli\/|demo\/|index)/, 4],
]
const layerOf = (module: string) => LAYERS.find(([pattern]) => pattern.test(module))?.[1] ?? 4

describe('imports between src/ modules', () => {
  const edges = graph()

  it('finds the modules (the graph is not empty)', () => {
    expect(edges.size).toBeGreaterThan(50)
    expect(edges.get('core/ledger.ts')).toContain('core/clock.ts')
  })

  it('form no cycle', () => {
    expect(cycles(edges)).toEqual([])
  })

  it('point down the layers: core imports nothing above it; stores, testing and the client nothing of http, messaging or the CLI', () => {
    const upward: string[] = []
    for (const [from, targets] of edges) {
      for (const to of targets) if (layerOf(to) > layerOf(from)) upward.push(`${from} -> ${to}`)
    }
    expect(upward).toEqual([])
  })
})
