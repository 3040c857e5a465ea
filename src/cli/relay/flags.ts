/** What `idemkey relay` parses its flags into (shared by the command and its runner, which loads later). */

/** The brokers `--to` names, by URL scheme. */
export type BrokerKind = 'nats' | 'rabbitmq' | 'redis'

/** What `idemkey relay` was asked to do, once its flags are parsed. */
export interface RelayFlags {
  from: string
  to: { kind: BrokerKind; url: string }
  table: string
  slot?: string
  publication?: string
  batchSize: number
  maxLag: number
  /** Milliseconds (parsed by durationOption). */
  silentConnectionTimeout: number
  exchange: string
  setup: boolean
  healthPort?: number
  healthHost: string
}
