import { describe, expect, it } from 'vitest'
import type { RedisClientLike, RedisSubscriberLike } from './client.js'
import { Notifier } from './notifier.js'

/**
 * A subscriber connection that refuses SUBSCRIBE while `down` (Redis unreachable), and a client whose
 * duplicate() is it. What the notifier does with them is its own bookkeeping; the real subscriber and
 * the real PUBLISH are in src/backends/redis/redis-notifications.test.ts.
 */
function fakeRedis() {
  const state = { down: true, subscribes: [] as string[] }
  let onMessage: ((channel: string, message: string) => void) | undefined
  const subscriber = {
    subscribe: async (...channels: string[]) => {
      state.subscribes.push(...channels)
      if (state.down) throw new Error('Connection is closed.')
    },
    unsubscribe: async () => {},
    on(event: string, listener: (...args: never[]) => void) {
      if (event === 'message') onMessage = listener as unknown as typeof onMessage
      return subscriber
    },
    quit: async () => {},
    disconnect: () => {},
  } as unknown as RedisSubscriberLike
  const client = { duplicate: () => subscriber } as unknown as RedisClientLike
  return { client, state, publish: (channel: string) => onMessage?.(channel, '1') }
}

const turns = () => new Promise((resolve) => setTimeout(resolve, 0))

describe('Notifier', () => {
  it('subscribes again for the next watcher of a channel whose SUBSCRIBE failed while Redis was down', async () => {
    const redis = fakeRedis()
    const notifier = new Notifier(redis.client)
    let woken = 0
    notifier.watch('ch', () => woken++)
    await turns()
    expect(redis.state.subscribes).toEqual(['ch'])
    expect(woken).toBe(0) // the failed subscription announced nothing: that waiter polls

    redis.state.down = false
    notifier.watch('ch', () => woken++)
    await turns()
    expect(redis.state.subscribes).toEqual(['ch', 'ch'])
    expect(woken).toBe(2) // both watchers: "it may have changed", once the subscription is in place
    redis.publish('ch')
    expect(woken).toBe(4) // and both are woken by the channel's messages from now on

    notifier.watch('ch', () => woken++)
    await turns()
    expect(redis.state.subscribes).toEqual(['ch', 'ch']) // subscribed: a third watcher asks nothing
    await notifier.close()
  })
})
