import { mysqlTableName, supportsSkipLocked } from './messaging.js'

describe('MySQL messaging helpers', () => {
  it('knows which servers can skip locked rows: MySQL from 8.0.1, MariaDB from 10.6', () => {
    expect(supportsSkipLocked('10.11.19-MariaDB-0+deb12u1')).toBe(true)
    expect(supportsSkipLocked('10.6.0-MariaDB')).toBe(true)
    expect(supportsSkipLocked('10.5.27-MariaDB-log')).toBe(false)
    expect(supportsSkipLocked('5.5.5-10.4.34-MariaDB')).toBe(false)
    expect(supportsSkipLocked('8.0.36')).toBe(true)
    expect(supportsSkipLocked('8.0.0-dmr')).toBe(false)
    expect(supportsSkipLocked('5.7.44-log')).toBe(false)
    expect(supportsSkipLocked('9.1.0')).toBe(true)
  })

  it('quotes a table or database.table and names its _meta table beside it; refuses anything else', () => {
    expect(mysqlTableName('app.outbox', 'x')).toEqual({ name: 'app.outbox', sql: '`app`.`outbox`', meta: '`app`.`outbox_meta`' })
    expect(mysqlTableName('outbox', 'x').meta).toBe('`outbox_meta`')
    for (const bad of ['a.b.c', 'a-b', '`x`', 't'.repeat(60), '']) {
      expect(() => mysqlTableName(bad, 'MySqlOutbox table')).toThrow(expect.objectContaining({ code: 'INVALID_OPTION' }))
    }
  })
})
