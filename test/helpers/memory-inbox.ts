import { IdempotencyError } from '../../src/errors.js'
import type { Inbox } from '../../src/messaging/inbox/types.js'

/**
 * An inbox in memory, for consumer tests about the broker side: applies each ID once, refuses a
 * message without ID as the real ones do, and lists what it applied.
 */
export function memoryInbox(consumer = 'memory'): Inbox<undefined> & { applied: string[] } {
  const applied: string[] = []
  return {
    consumer,
    applied,
    async handle(message, effect) {
      if (!message.id) throw new IdempotencyError('INVALID_ARGUMENT', 'no message ID')
      if (applied.includes(message.id)) return { status: 'duplicate' }
      const value = await effect(undefined, message)
      applied.push(message.id)
      return { status: 'applied', value }
    },
  }
}
