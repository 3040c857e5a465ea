/**
 * idemkey/observability: the operator page (mountable in any Node, Express or Fastify app) and the key
 * hash used in telemetry and logs. Spans and metrics: idemkey/opentelemetry. docs/observability.md.
 */
export { Activity, type ActivitySnapshot, type RecentMismatch, SERIES, type Series } from './activity.js'
export {
  isLoopback,
  type OperatorPage,
  type OperatorPageOptions,
  type OperatorPageRelay,
  type OperatorSummary,
  operatorPage,
  type PastLeaseHolder,
} from './operator-page.js'
export { keyHash } from './recorder.js'
