/** The proxy command's parsed flags: read by the command (cli/commands/proxy.ts) and by what it runs (cli/proxy/run.ts). */
import type { LogLevel } from './logger.js'

/** The flags of `idemkey proxy`, parsed. */
export interface ProxyFlags {
  upstream: string
  port: number
  host: string
  store: string
  lease: number
  ttl: number
  wait: number
  methods: string[]
  requireKey?: boolean
  scopeHeader?: string
  scopeSecret?: string
  scopeCredentials?: string[]
  maxBody: number
  upstreamTimeout: number
  drainTimeout: number
  headerTimeout: number
  bodyTimeout: number
  maxConnections: number
  maxBuffered: number
  maxStoredBody: number
  maxTunnels: number
  tunnelIdleTimeout: number
  adminPort?: number
  adminHost: string
  adminToken?: string
  adminAllowedHosts?: string[]
  logLevel: LogLevel
  logFormat?: 'json' | 'pretty'
}
