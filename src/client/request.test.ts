import fc from 'fast-check'
import { toReplayable } from './request.js'

/** What fetch itself would send for a body: the bytes and content type a Response serializes it to. */
async function asFetchWould(body: BodyInit): Promise<{ bytes: Uint8Array; type: string | null }> {
  const response = new Response(body)
  return { bytes: new Uint8Array(await response.arrayBuffer()), type: response.headers.get('content-type') }
}

describe('toReplayable reads a body once, as fetch would send it', () => {
  it('sends a string body as the UTF-8 bytes and text/plain content type fetch would, lone surrogates included (property)', async () => {
    await fc.assert(
      fc.asyncProperty(fc.oneof(fc.string({ unit: 'binary' }), fc.constant('lone \ud800 surrogate')), async (text) => {
        const request = await toReplayable('http://app/x', { method: 'POST', body: text }, 'POST')
        const expected = await asFetchWould(text)
        expect(request.init.body).toEqual(expected.bytes)
        expect(request.headers.get('content-type')).toBe(expected.type)
      }),
    )
  })

  it("keeps the caller's content type for a string body", async () => {
    const request = await toReplayable(
      'http://app/x',
      { method: 'POST', body: '{}', headers: { 'content-type': 'application/json' } },
      'POST',
    )
    expect(request.headers.get('content-type')).toBe('application/json')
  })

  it('sends a copy of a Uint8Array or Buffer body, a plain Uint8Array with no content type, so later writes to it change nothing', async () => {
    for (const body of [new Uint8Array([1, 2, 3]), Buffer.from([1, 2, 3]), new Uint8Array([0, 1, 2, 3, 4]).subarray(1, 4)]) {
      const request = await toReplayable('http://app/x', { method: 'POST', body }, 'POST')
      body[0] = 9
      expect(request.init.body).toEqual(new Uint8Array([1, 2, 3]))
      expect(Object.getPrototypeOf(request.init.body)).toBe(Uint8Array.prototype)
      expect(request.headers.has('content-type')).toBe(false)
    }
  })
})
