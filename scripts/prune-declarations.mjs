// Removes the declaration files no public subpath reaches, after the build (scripts/build.mjs). A module
// that no export's types import, directly or through another declaration, is internal: its .d.ts would
// never be read by a user's compiler, and such files were a fifth of the tarball. The walk starts from
// every `types` that package.json's exports and typesVersions name, and follows each relative module
// specifier of a declaration file (import/export ... from, import("..."), import "...").
import { existsSync, readdirSync, readFileSync, rmSync } from 'node:fs'
import { dirname, join, normalize } from 'node:path'

const SPECIFIER = /(?:\bfrom\s+|\bimport\s*\(\s*|\bimport\s+)['"](\.{1,2}\/[^'"]+)['"]/g

/** The declaration file a relative specifier of `from` names (`./x.js` is `./x.d.ts`, `./dir/index.js` alike). */
function declarationOf(from, specifier) {
  const path = normalize(join(dirname(from), specifier))
  const candidates = [
    path
      .replace(/\.js$/, '.d.ts')
      .replace(/\.cjs$/, '.d.cts')
      .replace(/\.mjs$/, '.d.mts'),
    `${path}.d.ts`,
    join(path, 'index.d.ts'),
  ]
  const found = candidates.find((candidate) => existsSync(candidate))
  if (!found) throw new Error(`${from} imports ${specifier}, which has no declaration file`)
  return found
}

/** Every `types` path of package.json (exports' conditions, typesVersions, the top-level field). */
function entryDeclarations(manifest) {
  const entries = new Set(manifest.types ? [normalize(manifest.types)] : [])
  const visit = (value) => {
    if (typeof value !== 'object' || value === null) return
    for (const [key, inner] of Object.entries(value)) {
      if (key === 'types' && typeof inner === 'string') entries.add(normalize(inner))
      else visit(inner)
    }
  }
  visit(manifest.exports)
  for (const paths of Object.values(manifest.typesVersions?.['*'] ?? {})) for (const path of paths) entries.add(normalize(path))
  return entries
}

export function pruneDeclarations(distDir = 'dist') {
  const manifest = JSON.parse(readFileSync('package.json', 'utf8'))
  const reached = new Set()
  const pending = [...entryDeclarations(manifest)]
  while (pending.length > 0) {
    const file = pending.pop()
    if (reached.has(file)) continue
    if (!existsSync(file)) throw new Error(`package.json names ${file}, which the build did not emit`)
    reached.add(file)
    for (const [, specifier] of readFileSync(file, 'utf8').matchAll(SPECIFIER)) pending.push(declarationOf(file, specifier))
  }
  let removed = 0
  for (const name of readdirSync(distDir, { recursive: true, encoding: 'utf8' })) {
    const file = join(distDir, name)
    if (/\.d\.(c|m)?ts$/.test(file) && !reached.has(file)) {
      rmSync(file)
      removed++
    }
  }
  return { kept: reached.size, removed }
}
