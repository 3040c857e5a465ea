import { execFile } from 'node:child_process'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { pathToFileURL } from 'node:url'
import { promisify } from 'node:util'
import { afterAll, describe, expect, it } from 'vitest'

const ROOT = join(import.meta.dirname, '..')
const dir = mkdtempSync(join(tmpdir(), 'idemkey-dynamodb-driver-'))
afterAll(() => rmSync(dir, { recursive: true, force: true }))

describe('DynamoDbStore without @aws-sdk/client-dynamodb', () => {
  it('fails its first operation with INVALID_OPTION naming npm i @aws-sdk/client-dynamodb', async () => {
    // A process where the SDK cannot be resolved, as in an app that never installed it.
    const hooks = join(dir, 'hooks.mjs')
    writeFileSync(
      hooks,
      `export async function resolve(specifier, context, next) {
  if (specifier === '@aws-sdk/client-dynamodb') {
    const error = new Error("Cannot find package '@aws-sdk/client-dynamodb' imported from " + context.parentURL)
    error.code = 'ERR_MODULE_NOT_FOUND'
    throw error
  }
  return next(specifier, context)
}
`,
    )
    const register = join(dir, 'register.mjs')
    writeFileSync(register, `import { register } from 'node:module'\nregister(${JSON.stringify(pathToFileURL(hooks).href)})\n`)
    const script = join(dir, 'main.mts')
    writeFileSync(
      script,
      `import { DynamoDbStore } from ${JSON.stringify(pathToFileURL(join(ROOT, 'src/backends/dynamodb/index.ts')).href)}
const store = new DynamoDbStore({ table: 'idemkey' })
try {
  await store.get('s', 'k')
  console.log(JSON.stringify({ code: 'none' }))
} catch (error) {
  console.log(JSON.stringify({ code: error.code, message: error.message }))
}
`,
    )
    const { stdout } = await promisify(execFile)(process.execPath, ['--import', 'tsx', '--import', pathToFileURL(register).href, script], {
      cwd: ROOT,
      timeout: 30_000,
    })
    const result = JSON.parse(stdout.trim().split('\n').at(-1) as string)
    expect(result.code).toBe('INVALID_OPTION')
    expect(result.message).toContain('npm i @aws-sdk/client-dynamodb')
  })
})
