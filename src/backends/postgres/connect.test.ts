import { EventEmitter } from 'node:events'
import { holding } from './connect.js'

/** A checked-out pg client as holding() sees it: an emitter of 'error', and release(destroy). */
class CheckedOutClient extends EventEmitter {
  readonly releases: Array<boolean | Error | undefined> = []
  release(destroy?: boolean | Error): void {
    this.releases.push(destroy)
  }
}

describe('holding: a checked-out PostgreSQL client', () => {
  it('listens for a lost connection only while it holds the client, and pools it back', async () => {
    const client = new CheckedOutClient()
    for (let i = 0; i < 20; i++) {
      await holding(client, async () => {
        expect(client.listenerCount('error')).toBe(1)
      })
    }
    // A listener left behind on a pooled client would pile up, one per transaction, on every client.
    expect(client.listenerCount('error')).toBe(0)
    expect(client.releases).toEqual(Array(20).fill(false))
  })

  it('keeps the process up when the connection breaks while held, tells the work, and destroys the client', async () => {
    const client = new CheckedOutClient()
    const seen = await holding(client, async (held) => {
      const before = held.lost()
      client.emit('error', new Error('Connection terminated unexpectedly'))
      return [before, held.lost()]
    })
    expect(seen).toEqual([false, true])
    expect(client.releases).toEqual([true])
    expect(client.listenerCount('error')).toBe(0)
  })

  it('destroys a client the work discarded, and releases one whose work threw', async () => {
    const discarded = new CheckedOutClient()
    await holding(discarded, async (held) => held.discard())
    expect(discarded.releases).toEqual([true])

    const failed = new CheckedOutClient()
    await expect(
      holding(failed, async () => {
        throw new Error('statement failed')
      }),
    ).rejects.toThrow('statement failed')
    expect(failed.releases).toEqual([false])
    expect(failed.listenerCount('error')).toBe(0)
  })
})
