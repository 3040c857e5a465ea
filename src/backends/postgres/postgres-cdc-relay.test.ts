import { lsnToBigInt, PgCdcRelay } from './postgres-cdc-relay.js'

const publisher = { name: 'none', publish: async () => [] }

describe('PgCdcRelay without a server', () => {
  it('compares LSNs by their 64-bit position, not as text', () => {
    expect(lsnToBigInt('0/0')).toBe(0n)
    expect(lsnToBigInt('1/0')).toBe(4_294_967_296n)
    expect(lsnToBigInt('16/B374D848')).toBe((0x16n << 32n) + 0xb374d848n)
    // As text "9/FFFFFFFF" sorts after "10/0"; as positions it comes before.
    expect(lsnToBigInt('9/FFFFFFFF') < lsnToBigInt('10/0')).toBe(true)
  })

  it('names the slot and the publication after the table, and refuses a slot name PostgreSQL would not take', () => {
    const relay = new PgCdcRelay({ connection: 'postgres://127.0.0.1/db', publisher, table: 'app.Orders_Outbox' })
    expect(relay.slot).toBe('idemkey_cdc_app_orders_outbox')
    expect(relay.publication).toBe(relay.slot)
    expect(() => new PgCdcRelay({ connection: 'postgres://127.0.0.1/db', publisher, slot: 'Has-Dash' })).toThrow(/lowercase letters/)
    expect(() => new PgCdcRelay({ connection: 'postgres://127.0.0.1/db', publisher, batchSize: 0 })).toThrow(
      /batchSize must be a positive integer/,
    )
    expect(() => new PgCdcRelay({ connection: 'postgres://127.0.0.1/db', publisher, table: 'a;drop' })).toThrow(/plain SQL identifier/)
  })

  it('refuses a silentConnectionTimeout that is not a duration, or shorter than two of its 1 s keepalive requests', () => {
    const relay = (silentConnectionTimeout: unknown) =>
      new PgCdcRelay({ connection: 'postgres://127.0.0.1/db', publisher, silentConnectionTimeout: silentConnectionTimeout as string })
    expect(() => relay('1s')).toThrow(
      expect.objectContaining({
        code: 'INVALID_OPTION',
        message: expect.stringMatching(/silentConnectionTimeout must be at least 2000 ms.*got 1000 ms/),
      }),
    )
    expect(() => relay(-5)).toThrow(
      expect.objectContaining({ code: 'INVALID_OPTION', message: expect.stringContaining('silentConnectionTimeout') }),
    )
    expect(() => relay('soon')).toThrow(/silentConnectionTimeout "soon" is not a duration/)
    expect(() => relay(Number.NaN)).toThrow(/silentConnectionTimeout must be a non-negative number/)
    expect(() => relay('2s')).not.toThrow()
    expect(() => relay(undefined)).not.toThrow()
  })

  it('needs a connection and a publisher', () => {
    expect(() => new PgCdcRelay({} as never)).toThrow(expect.objectContaining({ code: 'INVALID_OPTION' }))
  })

  it('refuses what would loop or fail later: a publisher without publish(), an onEvent that is no function, a first backoff or standby retry of 0', () => {
    const connection = 'postgres://127.0.0.1/db'
    const refusals: Array<[Record<string, unknown>, string]> = [
      [{ publisher: { name: 'p' } }, 'PgCdcRelay: publisher must be an object with publish(); it has no publish().'],
      [{ onEvent: 'log' }, 'PgCdcRelay: onEvent must be a function'],
      [{ backoffInitial: 0 }, 'backoffInitial must be longer than 0, got 0ms.'],
      [{ standbyRetry: '0s' }, 'standbyRetry must be longer than 0, got 0ms.'],
    ]
    for (const [bad, message] of refusals) {
      expect(() => new PgCdcRelay({ connection, publisher, ...bad } as never), message).toThrow(
        expect.objectContaining({ code: 'INVALID_OPTION', message: expect.stringContaining(message) }),
      )
    }
  })
})
