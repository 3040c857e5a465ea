import type { CredentialRule } from '../../http/credentials.js'
import { credentialScope, headerScope, resolveScopeSecret } from '../../http/scope.js'
import type { HttpRequestLike } from '../../http/types.js'

/**
 * The proxy's scope rule: the trusted header's value when it is there, else the keyed hash of the
 * credential. Each source keeps its own prefix, so a tenant named `public`, or a header value copied
 * from `idemkey list` (`cred:…`), can never land in another source's scope.
 */
export function proxyScope(
  scopeHeader: string | undefined,
  scopeSecret: string | undefined,
  credentials: CredentialRule,
): (req: HttpRequestLike) => string {
  const secret = resolveScopeSecret(scopeSecret)
  const name = scopeHeader?.toLowerCase()
  return (req) => {
    const value = name === undefined ? undefined : req.headers[name]
    const first = Array.isArray(value) ? value[0] : value
    return first ? headerScope(first) : credentialScope(req.headers, secret, credentials)
  }
}
