import type { IncomingMessage } from 'node:http'
import { readNodeBody } from '../../http/node-body.js'
import { proxyProblem, Refusal } from './http.js'
import type { BudgetTicket, ByteBudget } from './limits.js'

/** Reads a covered request's body: see {@link coveredBodyReader}. */
export type CoveredBodyReader = (req: IncomingMessage, limit: number, ticket: BudgetTicket) => Promise<Uint8Array>

/**
 * The proxy's reader of covered request bodies, within `budget` and `bodyTimeoutMs`; out of room it
 * says so through `log`.
 */
export function coveredBodyReader(budget: ByteBudget, bodyTimeoutMs: number, log: (kind: string, line: string) => void): CoveredBodyReader {
  return readCoveredBody

  /**
   * Reads a covered request's body within the byte budget and `bodyTimeoutMs`. A declared length is
   * taken from the budget up front, a body without one chunk by chunk. Out of room or out of time: a
   * {@link Refusal} (`503` or `408`), before the ledger has seen the request.
   */
  async function readCoveredBody(req: IncomingMessage, limit: number, ticket: BudgetTicket): Promise<Uint8Array> {
    const declared = Number(req.headers['content-length'] ?? Number.NaN)
    const known = Number.isFinite(declared) && declared >= 0
    // Over the limit, readNodeBody answers 413 before reading: nothing to take then.
    if (!ticket.tryTake(known && declared <= limit ? declared : 0)) throw overloaded()
    const onChunk = known
      ? undefined
      : (bytes: number) => {
          if (!ticket.tryTake(bytes)) throw overloaded()
        }
    // A body received whole already (a small one comes in the packet of its headers) has no deadline
    // left to keep: no timer for it.
    if (req.complete) return readNodeBody(req, limit, { onStop: 'pause', onChunk })
    return readNodeBody(req, limit, { timeoutMs: bodyTimeoutMs, timedOut: bodyTimedOut, onStop: 'pause', onChunk })
  }

  function overloaded(): Refusal {
    log(
      'overloaded',
      `answering 503 to new covered requests: ${budget.used} bytes held, --max-buffered is ${budget.limit} (raise it, or add proxies)`,
    )
    return new Refusal(
      proxyProblem(
        503,
        'proxy-overloaded',
        'Proxy overloaded',
        'The proxy holds as many request and response bytes as it may right now, so this request was not run and nothing was recorded for it. Retry with the same Idempotency-Key after the Retry-After delay.',
      ),
    )
  }

  function bodyTimedOut(): Refusal {
    return new Refusal(
      proxyProblem(
        408,
        'request-timeout',
        'Request body timed out',
        `The request body did not arrive within ${Math.ceil(bodyTimeoutMs / 1_000)} s, so the request was not run and nothing was recorded for it. Retry with the same Idempotency-Key.`,
      ),
    )
  }
}
