import { readFileSync } from 'node:fs'
import { dirname, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import { createIdempotentFetch, deriveKey, forwardKey, IdempotentRequestError, idempotencyInfo, idempotentFetch, uuidv7 } from './index.js'

const here = dirname(fileURLToPath(import.meta.url))

/** Every module `file` reaches through its static imports, and every bare specifier on the way. */
function importsOf(file: string, seen = new Set<string>(), bare = new Set<string>()): { seen: Set<string>; bare: Set<string> } {
  if (seen.has(file)) return { seen, bare }
  seen.add(file)
  const source = readFileSync(file, 'utf8')
  for (const [, specifier] of source.matchAll(/^(?:import|export)\s[^'"]*?from\s+'([^']+)'/gm)) {
    if (specifier === undefined) continue
    if (specifier.startsWith('.')) importsOf(resolve(dirname(file), specifier.replace(/\.js$/, '.ts')), seen, bare)
    else bare.add(specifier)
  }
  return { seen, bare }
}

describe('idemkey/client', () => {
  it('depends on nothing beyond the platform: no package is imported, only node: built-ins', () => {
    const { seen, bare } = importsOf(resolve(here, 'index.ts'))
    expect(seen.size).toBeGreaterThan(5)
    expect(bare.has('node:crypto')).toBe(true) // the scan sees imports (deriveKey's HMAC)
    expect([...bare].filter((specifier) => !specifier.startsWith('node:'))).toEqual([])
  })

  it('exports the fetch wrapper, the key helpers and the error', () => {
    for (const exported of [createIdempotentFetch, idempotentFetch, idempotencyInfo, deriveKey, forwardKey, uuidv7]) {
      expect(typeof exported).toBe('function')
    }
    expect(new IdempotentRequestError('REQUEST_REJECTED', 'x', { key: 'k', attempts: 1 })).toBeInstanceOf(Error)
  })
})
