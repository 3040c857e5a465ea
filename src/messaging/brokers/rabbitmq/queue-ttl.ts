/**
 * Reads a RabbitMQ queue's `x-message-ttl` argument, the bound on how long it can still deliver a
 * message. AMQP 0-9-1 has no call that returns a queue's arguments (`checkQueue` answers only its
 * counts), but a non-passive `queue.declare` with other arguments is refused with a message that
 * names the current value ("inequivalent arg 'x-message-ttl' ... current is the value '3600000'").
 * So the helper declares the queue on throwaway channels, adopting each property the broker says
 * differs (durable, auto_delete, x-expires, x-queue-type, ...), until the refusal is about the TTL.
 *
 * Limits (docs/messaging.md, "Choosing the inbox retention"): a TTL set by a policy is not an
 * argument and stays invisible; each refusal is a channel error in the broker's log; a user without
 * `configure` permission on the queue is refused outright, and so is a server-named queue (`amq.gen-…`);
 * then the TTL is unknown.
 */
import type { Channel } from 'amqplib'

/**
 * The TTL the probe declares. Should the queue be deleted between the existence check and a probe
 * declaration (which would then create it), a queue keeping messages 24.8 days is the harmless one.
 */
const PROBE_TTL_MS = 2_147_483_647

/** Declarations tried at most: one per property that can differ before the TTL (durable, auto_delete, x-expires, x-queue-type, ...). */
const MAX_PROBES = 8

interface Declaration {
  durable: boolean
  autoDelete: boolean
  exclusive: boolean
  arguments: Record<string, unknown>
}

/** What a refused declaration says differs: the property, and its current value (`null`: none). */
interface Inequivalence {
  field: string
  current: string | null
  type: string | undefined
}

const INEQUIVALENT =
  /inequivalent arg '([^']+)' for queue .*: received .* but current is (none|the value '([^']*)' of type '([^']*)'|'([^']*)')/

/** The property and current value a PRECONDITION_FAILED refusal names, if it is one. */
export function parseInequivalence(message: string): Inequivalence | undefined {
  const match = INEQUIVALENT.exec(message)
  if (!match) return undefined
  const [, field, whole, typedValue, type, plainValue] = match
  if (whole === 'none') return { field: field as string, current: null, type: undefined }
  return { field: field as string, current: (typedValue ?? plainValue) as string, type }
}

/** The argument value to declare for a current value the broker printed (with its AMQP type when it said). */
function argumentValue(current: string, type: string | undefined): unknown {
  if (type === 'longstr' || type === 'shortstr') return current
  if (type === 'bool') return current === 'true'
  if (/^-?\d+$/.test(current)) return Number(current)
  return current
}

/** Takes the broker's current value of `difference` into the next declaration. */
function adopt(declaration: Declaration, difference: Inequivalence): void {
  if (difference.field === 'durable') declaration.durable = difference.current === 'true'
  else if (difference.field === 'auto_delete') declaration.autoDelete = difference.current === 'true'
  else if (difference.current === null) delete declaration.arguments[difference.field]
  else declaration.arguments[difference.field] = argumentValue(difference.current, difference.type)
}

/** A fresh channel on `channel`'s connection, of its class; a refused declaration closes only it. */
async function openBeside(channel: Channel): Promise<Channel | undefined> {
  const connection = (channel as Partial<Channel>).connection
  const Ctor = channel.constructor as (new (connection: unknown) => Channel & { open?: () => Promise<unknown> }) | undefined
  if (!connection || typeof Ctor !== 'function') return undefined
  const probe = new Ctor(connection)
  if (typeof probe.open !== 'function') return undefined
  probe.on('error', () => {}) // the refusal closes this channel, as intended
  await probe.open()
  return probe
}

/**
 * The queue's `x-message-ttl` in ms; `null` when the queue has no such argument; `undefined` when
 * it cannot be told (no queue, no permission, a broker answering otherwise).
 */
export async function readQueueMessageTtl(channel: Channel, queue: string): Promise<number | null | undefined> {
  let probe: Channel | undefined
  try {
    probe = await openBeside(channel)
    if (!probe) return undefined
    // Only an existing queue is probed: a declaration of a missing one would create it.
    await probe.checkQueue(queue)
    const declaration: Declaration = { durable: true, autoDelete: false, exclusive: false, arguments: { 'x-message-ttl': PROBE_TTL_MS } }
    for (let attempt = 0; attempt < MAX_PROBES; attempt++) {
      try {
        await probe.assertQueue(queue, declaration)
        // Accepted: the queue's TTL is the one declared (equal arguments are a no-op).
        return PROBE_TTL_MS
      } catch (error) {
        const message = String((error as Error).message)
        const difference = parseInequivalence(message)
        if (!difference) {
          // An exclusive queue answers RESOURCE_LOCKED to a non-exclusive declaration: it may be this
          // connection's own (declared exclusive, the probe gets through); another's stays locked.
          if (!/RESOURCE_LOCKED/.test(message) || declaration.exclusive) return undefined
          declaration.exclusive = true
          probe = await openBeside(channel)
          if (!probe) return undefined
          continue
        }
        if (difference.field === 'x-message-ttl') return difference.current === null ? null : Number(difference.current)
        adopt(declaration, difference)
        probe = await openBeside(channel)
        if (!probe) return undefined
      }
    }
    return undefined
  } catch {
    return undefined
  } finally {
    await probe?.close().catch(() => {})
  }
}
