import { createHash } from 'node:crypto'
import { credentialScope, functionScope, headerScope, normalizeCredential, resolveScopeSecret } from './scope.js'

describe('credentialScope', () => {
  it('keys the hash with the deployment secret, so the store alone cannot confirm a guessed password', () => {
    const headers = { authorization: 'Basic YWxpY2U6aHVudGVyMg==' }
    const a = credentialScope(headers, 'secret-a')
    const b = credentialScope(headers, 'secret-b')
    expect(a).toMatch(/^cred:[0-9a-f]{32}$/)
    expect(a).not.toBe(b)
    // Not the unkeyed SHA-256 that round 1 stored (and `idemkey list` printed).
    const unkeyed = createHash('sha256').update(headers.authorization).digest('hex').slice(0, 32)
    expect(a).not.toContain(unkeyed)
  })

  it('gives one credential one scope whatever the case of its scheme and the spaces after it', () => {
    const scope = credentialScope({ authorization: 'Bearer tok-1' }, 's')
    expect(credentialScope({ authorization: 'bearer tok-1' }, 's')).toBe(scope)
    expect(credentialScope({ authorization: '  BEARER   tok-1 ' }, 's')).toBe(scope)
    // The credential itself is case-sensitive: another token is another caller.
    expect(credentialScope({ authorization: 'Bearer TOK-1' }, 's')).not.toBe(scope)
  })

  it('answers public only when there is no credential at all', () => {
    expect(credentialScope({}, 's')).toBe('public')
    expect(credentialScope({ authorization: '   ' }, 's')).toBe('public')
    expect(credentialScope({ authorization: ['Bearer a', 'Bearer b'] }, 's')).toMatch(/^cred:/)
  })

  it('normalises only the scheme', () => {
    expect(normalizeCredential('DIGEST  username="Mufasa"')).toBe('digest username="Mufasa"')
    expect(normalizeCredential('opaque-token')).toBe('opaque-token')
  })
})

describe('scope namespaces', () => {
  it('never lets a header value or a function result land in the credential or public scope', () => {
    const credential = credentialScope({ authorization: 'Bearer x' }, 's')
    expect(headerScope(credential)).not.toBe(credential)
    expect(headerScope('public')).not.toBe('public')
    expect(functionScope('public')).not.toBe('public')
    expect(functionScope(credential)).not.toBe(credential)
    expect(functionScope('t1')).not.toBe(headerScope('t1'))
  })

  it('refuses a scope function result of nothing as a configuration error', () => {
    for (const value of [undefined, null, '', '  ', {}, Number.NaN]) {
      expect(() => functionScope(value)).toThrow(expect.objectContaining({ code: 'INVALID_OPTION' }))
    }
    expect(functionScope(42)).toBe('fn:42')
    expect(functionScope('tenant-7')).toBe('fn:tenant-7')
  })
})

describe('resolveScopeSecret', () => {
  it('takes the option first, then IDEMKEY_SCOPE_SECRET', () => {
    const saved = process.env.IDEMKEY_SCOPE_SECRET
    try {
      process.env.IDEMKEY_SCOPE_SECRET = 'from-env'
      expect(resolveScopeSecret('from-option')).toBe('from-option')
      expect(resolveScopeSecret(undefined)).toBe('from-env')
      delete process.env.IDEMKEY_SCOPE_SECRET
      // Unset: still one value for every process (instances must agree), and a warning once.
      expect(resolveScopeSecret(undefined, false)).toBe(resolveScopeSecret(undefined, false))
    } finally {
      if (saved === undefined) delete process.env.IDEMKEY_SCOPE_SECRET
      else process.env.IDEMKEY_SCOPE_SECRET = saved
    }
  })
})

describe('warnSharedScope', () => {
  it('warns once per front end made without a scope, naming it, the risk and how to give one', async () => {
    const warned = vi.spyOn(process, 'emitWarning').mockImplementation(() => {})
    try {
      const { warnSharedScope } = await import('./scope.js')
      warnSharedScope('idempotent() (a test front end)', 'scope: ({ ctx }) => ctx.userId')
      warnSharedScope('idempotent() (a test front end)', 'scope: ({ ctx }) => ctx.userId')
      warnSharedScope('idempotentAction() (another test front end)', 'scope: () => user.id')
      expect(warned.mock.calls.map((call) => [String(call[0]).split(' was given')[0], call[1]])).toEqual([
        ['idempotent() (a test front end)', { code: 'IDEMKEY_SHARED_SCOPE' }],
        ['idempotentAction() (another test front end)', { code: 'IDEMKEY_SHARED_SCOPE' }],
      ])
      expect(String(warned.mock.calls[0]?.[0])).toMatch(/a caller who learns another's key can replay that caller's result\. Give scope/)
    } finally {
      warned.mockRestore()
    }
  })
})
