/**
 * idemkey/next: a server action wrapped with idempotentAction runs once per form render's key (a double
 * submit or a retry gets the first result), refuses the key with other form values, works for
 * `(formData)` and `useActionState`'s `(previousState, formData)`, and says what to render when the key
 * is missing.
 */

import { MemoryStore } from '../../backends/memory/memory-store.js'
import { Ledger } from '../../core/ledger.js'
import { ACTION_KEY_FIELD, actionKey, idempotentAction } from './index.js'

const ledger = new Ledger({ store: new MemoryStore() })
const form = (values: Record<string, string>) => {
  const data = new FormData()
  for (const [name, value] of Object.entries(values)) data.append(name, value)
  return data
}

describe('idemkey/next: server actions', () => {
  it('runs a double submit of one rendered form once; both get the first result', async () => {
    let orders = 0
    const placeOrder = idempotentAction(async (data: FormData) => ({ order: ++orders, sku: String(data.get('sku')) }), { ledger })
    const key = actionKey()
    const [a, b] = await Promise.all([
      placeOrder(form({ [ACTION_KEY_FIELD]: key, sku: 'A' })),
      placeOrder(form({ [ACTION_KEY_FIELD]: key, sku: 'A' })),
    ])
    expect(a).toEqual({ order: 1, sku: 'A' })
    expect(b).toEqual(a)
    expect(orders).toBe(1)
    // A new render is a new key: a new order.
    expect(await placeOrder(form({ [ACTION_KEY_FIELD]: actionKey(), sku: 'A' }))).toEqual({ order: 2, sku: 'A' })
  })

  it('refuses the key with other form values (FINGERPRINT_MISMATCH), and a form without a key (KEY_INVALID)', async () => {
    const pay = idempotentAction(async (data: FormData) => ({ paid: Number(data.get('amount')) }), { ledger })
    const key = actionKey()
    await pay(form({ [ACTION_KEY_FIELD]: key, amount: '5' }))
    await expect(pay(form({ [ACTION_KEY_FIELD]: key, amount: '6' }))).rejects.toMatchObject({ code: 'FINGERPRINT_MISMATCH' })
    await expect(pay(form({ amount: '6' }))).rejects.toThrow(/render <input type="hidden" name="idempotencyKey"/)
  })

  it("refuses the key on another action of the user's scope (a form's second button, formAction) with FINGERPRINT_MISMATCH: it got the first action's result, and never ran", async () => {
    const calls: string[] = []
    const scope = () => 'user-1'
    const save = idempotentAction(async (data: FormData) => ({ saved: calls.push(`save ${data.get('title')}`) }), {
      ledger,
      scope,
      name: 'save',
    })
    const publish = idempotentAction(async (data: FormData) => ({ published: calls.push(`publish ${data.get('title')}`) }), {
      ledger,
      scope,
      name: 'publish',
    })
    const rendered = form({ [ACTION_KEY_FIELD]: actionKey(), title: 'Hello' })
    expect(await save(rendered)).toEqual({ saved: 1 })
    await expect(publish(rendered)).rejects.toMatchObject({ code: 'FINGERPRINT_MISMATCH' })
    expect(calls).toEqual(['save Hello'])
    expect(await save(rendered)).toEqual({ saved: 1 })
  })

  it('refuses the key on another action without a scope of its own (the default scope is one for every action): both ran', async () => {
    const calls: string[] = []
    const save = idempotentAction(async (data: FormData) => ({ saved: calls.push(`save ${data.get('title')}`) }), { ledger, name: 'save' })
    const publish = idempotentAction(async (data: FormData) => ({ published: calls.push(`publish ${data.get('title')}`) }), {
      ledger,
      name: 'publish',
    })
    const rendered = form({ [ACTION_KEY_FIELD]: actionKey(), title: 'Hello' })
    expect(await save(rendered)).toEqual({ saved: 1 })
    await expect(publish(rendered)).rejects.toMatchObject({ code: 'FINGERPRINT_MISMATCH' })
    expect(calls).toEqual(['save Hello'])
  })

  it('replays an action that returns nothing as nothing (undefined), as the first submit got it (the replay said null)', async () => {
    let runs = 0
    const archive = idempotentAction(
      async (_data: FormData): Promise<void> => {
        runs++
      },
      { ledger, name: 'archive' },
    )
    const rendered = form({ [ACTION_KEY_FIELD]: actionKey(), id: 'doc-1' })
    expect(await archive(rendered)).toBeUndefined()
    expect(await archive(rendered)).toBeUndefined()
    expect(runs).toBe(1)
  })

  it("refuses a submit whose scope function yields nothing (INVALID_OPTION), not run (it fell back to a scope shared by every such user, and replayed one user's result to another)", async () => {
    let runs = 0
    const session: { user?: string } = {}
    const save = idempotentAction(async (data: FormData) => ({ saved: String(data.get('bio')), run: ++runs }), {
      ledger,
      name: 'save-profile',
      scope: async () => session.user as string,
    })
    const rendered = form({ [ACTION_KEY_FIELD]: actionKey(), bio: 'hi' })
    await expect(save(rendered)).rejects.toMatchObject({ code: 'INVALID_OPTION', message: expect.stringMatching(/scope/) })
    expect(runs).toBe(0)
    session.user = 'user-1'
    expect(await save(rendered)).toEqual({ saved: 'hi', run: 1 })
  })

  it('refuses a field or name that is no non-empty string when made (a field of 5 was found in no form: every submit refused)', () => {
    const action = async () => 'ok'
    for (const bad of [{ field: 5 }, { field: '' }, { name: {} }]) {
      expect(() => idempotentAction(action, { ledger, scope: () => 's', ...(bad as object) }), JSON.stringify(bad)).toThrow(
        expect.objectContaining({
          code: 'INVALID_OPTION',
          message: expect.stringMatching(/^idempotentAction\(\): (field|name) must be a non-empty string/),
        }),
      )
    }
    expect(() => idempotentAction(action, { ledger, scope: () => 's', field: 'submitKey', name: 'checkout' })).not.toThrow()
  })

  it('tells files apart by their bytes: another file of the same name, type and size is other form values', async () => {
    const upload = idempotentAction(async (data: FormData) => ({ bytes: (data.get('doc') as File).size }), { ledger })
    const key = actionKey()
    const withFile = (text: string) => {
      const data = form({ [ACTION_KEY_FIELD]: key })
      data.append('doc', new File([text], 'invoice.txt', { type: 'text/plain' }))
      return data
    }
    expect(await upload(withFile('aaaa'))).toEqual({ bytes: 4 })
    expect(await upload(withFile('aaaa'))).toEqual({ bytes: 4 })
    await expect(upload(withFile('bbbb'))).rejects.toMatchObject({ code: 'FINGERPRINT_MISMATCH' })
  })

  it('wraps a useActionState action (previousState, formData)', async () => {
    let runs = 0
    const subscribe = idempotentAction(
      async (_previous: { ok: boolean } | null, data: FormData) => {
        runs++
        return { ok: true, email: String(data.get('email')) }
      },
      { ledger, name: 'subscribe' },
    )
    const key = actionKey()
    const first = await subscribe(null, form({ [ACTION_KEY_FIELD]: key, email: 'a@example.com' }))
    const retry = await subscribe(null, form({ [ACTION_KEY_FIELD]: key, email: 'a@example.com' }))
    expect(retry).toEqual(first)
    expect(runs).toBe(1)
  })

  it("replays a useActionState double submit, which React calls with the first submit's result as its previous state", async () => {
    let runs = 0
    const subscribe = idempotentAction(
      async (_previous: { ok: boolean; run: number } | null, data: FormData) => ({
        ok: true,
        run: ++runs,
        email: String(data.get('email')),
      }),
      { ledger, name: 'subscribe-queued' },
    )
    const key = actionKey()
    // React queues a second submit of the form behind the first and hands it the first's result as state.
    const first = await subscribe(null, form({ [ACTION_KEY_FIELD]: key, email: 'b@example.com' }))
    const second = await subscribe(first, form({ [ACTION_KEY_FIELD]: key, email: 'b@example.com' }))
    expect(second).toEqual(first)
    expect(runs).toBe(1)
    // Other form values under the key are still refused, whatever the state.
    await expect(subscribe(first, form({ [ACTION_KEY_FIELD]: key, email: 'c@example.com' }))).rejects.toMatchObject({
      code: 'FINGERPRINT_MISMATCH',
    })
  })
})

/** What Next.js's `redirect()` throws: an error whose digest names the redirect (next/dist/client/components/redirect-error). */
function nextRedirect(url: string): never {
  throw Object.assign(new Error('NEXT_REDIRECT'), { digest: `NEXT_REDIRECT;push;${url};307;` })
}

describe('idemkey/next: an action that ends with redirect()', () => {
  it('records the redirect: a second submit of the form is sent to the same page and does not run again (the record was released, and each submit placed an order)', async () => {
    let orders = 0
    const placeOrder = idempotentAction(
      async (data: FormData) => {
        const id = ++orders
        nextRedirect(`/orders/${id}?sku=${String(data.get('sku'))}`)
      },
      { ledger, name: 'place-and-redirect' },
    )
    const rendered = form({ [ACTION_KEY_FIELD]: actionKey(), sku: 'R' })
    const first = await placeOrder(rendered).catch((error: unknown) => error)
    const second = await placeOrder(rendered).catch((error: unknown) => error)
    expect(first).toMatchObject({ message: 'NEXT_REDIRECT', digest: 'NEXT_REDIRECT;push;/orders/1?sku=R;307;' })
    expect(second).toBeInstanceOf(Error)
    expect(second).toMatchObject({ message: 'NEXT_REDIRECT', digest: 'NEXT_REDIRECT;push;/orders/1?sku=R;307;' })
    expect(orders).toBe(1)
  })

  it('still releases an action that throws any other error: the retry runs it', async () => {
    let attempts = 0
    const flaky = idempotentAction(
      async (_data: FormData) => {
        if (++attempts === 1) throw Object.assign(new Error('db down'), { digest: '12345' })
        return { ok: attempts }
      },
      { ledger, name: 'flaky' },
    )
    const rendered = form({ [ACTION_KEY_FIELD]: actionKey() })
    await expect(flaky(rendered)).rejects.toThrow('db down')
    expect(await flaky(rendered)).toEqual({ ok: 2 })
  })
})

describe('idemkey/next: durable steps in an action', () => {
  it('gives a function action the ledger context as this: its steps are recorded', async () => {
    const checkout = idempotentAction(
      async function (this, data: FormData) {
        const reserved = await this?.step('reserve', () => ({ sku: String(data.get('sku')) }))
        return { reserved }
      },
      { ledger, name: 'checkout' },
    )
    expect(await checkout(form({ [ACTION_KEY_FIELD]: actionKey(), sku: 'Z' }))).toEqual({ reserved: { sku: 'Z' } })
  })
})
