import { isIdempotencyError } from '../errors.js'
import { describeStore, driverError, parseStoreUrl } from './store-url.js'

describe('parseStoreUrl', () => {
  it('takes the location parameters out of the URL the driver gets', () => {
    expect(parseStoreUrl('postgres://app:secret@db:5432/app?schema=billing&table=idempotency&sslmode=require')).toEqual({
      kind: 'postgres',
      url: 'postgres://app:secret@db:5432/app?sslmode=require',
      location: { schema: 'billing', table: 'idempotency' },
    })
    expect(parseStoreUrl('mariadb://root@127.0.0.1:3306/test?table=keys')).toEqual({
      kind: 'mysql',
      url: 'mysql://root@127.0.0.1:3306/test',
      location: { table: 'keys' },
    })
    expect(parseStoreUrl('redis://127.0.0.1:6379?prefix=app1')).toMatchObject({
      url: 'redis://127.0.0.1:6379',
      location: { prefix: 'app1' },
    })
    expect(parseStoreUrl('sqlite:data/keys.db?table=app_keys')).toEqual({
      kind: 'sqlite',
      url: 'sqlite:data/keys.db',
      path: 'data/keys.db',
      location: { table: 'app_keys' },
    })
    expect(parseStoreUrl('sqlite:odd?name.db')).toMatchObject({ path: 'odd?name.db', location: {} })
  })

  it('refuses a parameter the store does not take, saying which it takes', () => {
    expect(() => parseStoreUrl('redis://127.0.0.1:6379?table=x')).toThrow('a redis store takes ?prefix=, not ?table=')
    expect(() => parseStoreUrl('mysql://root@h/db?schema=x')).toThrow('a mysql store takes ?table=, not ?schema=')
    expect(() => parseStoreUrl('sqlite:x.db?prefix=p')).toThrow('a sqlite store takes ?table=, not ?prefix=')
    expect(() => parseStoreUrl('postgres://h/db?table=')).toThrow('?table= needs a value')
    expect(() => parseStoreUrl('postgres://app:s3cret@h/db?table=')).toThrow('Store URL "postgres://app:***@h/db?table=" is not usable')
  })

  it('refuses a mysql:// URL without a database (every statement would fail with "No database selected")', () => {
    for (const url of ['mysql://root@127.0.0.1:3306', 'mariadb://root:s3cret@127.0.0.1:3306/?table=keys']) {
      expect(() => parseStoreUrl(url)).toThrow('a mysql:// URL needs the database in its path, e.g. mysql://root@127.0.0.1:3306/app.')
    }
    expect(() => parseStoreUrl('mariadb://root:s3cret@127.0.0.1:3306/')).toThrow(
      'Store URL "mariadb://root:***@127.0.0.1:3306/" is not usable',
    )
  })

  it('echoes a URL that does not parse without any of its password, even one holding / or @', () => {
    expect(() => parseStoreUrl('postgres://app:pa/ss@h/db')).toThrow('Store URL "postgres://app:***@h/db" is not usable')
    expect(() => parseStoreUrl('mysql://root:p@ss/w@h/test?table=')).toThrow('Store URL "mysql://root:***@h/test?table=" is not usable')
  })

  it('describes a store without its password, with its location', () => {
    expect(describeStore(parseStoreUrl('postgres://app:secret@db:5432/app?table=keys'))).toBe('postgres://app:***@db:5432/app?table=keys')
    expect(describeStore(parseStoreUrl('sqlite:keys.db?table=app_keys'))).toBe('sqlite:keys.db?table=app_keys')
  })
})

describe('driverError', () => {
  it('names a missing driver with the npm i line that installs it', () => {
    const missing = Object.assign(
      new Error("Cannot find package 'ioredis' imported from /app/node_modules/idemkey/dist/cli/store-url.js"),
      {
        code: 'ERR_MODULE_NOT_FOUND',
      },
    )
    const error = driverError('redis', 'ioredis', missing)
    expect(isIdempotencyError(error) && error.code).toBe('INVALID_OPTION')
    expect(error.message).toBe(
      'The redis store needs the ioredis package, which is not installed where idemkey is. Install it beside idemkey: npm i ioredis (or, for a one-off run: npx -p idemkey -p ioredis idemkey …).',
    )
    expect(error.cause).toBe(missing)
  })

  it('tells an installed driver whose native module did not load to be rebuilt', () => {
    const broken = new Error('Could not locate the bindings file. Tried:\n → /app/node_modules/better-sqlite3/build/better_sqlite3.node')
    expect(driverError('sqlite', 'better-sqlite3', broken).message).toMatch(
      /^The sqlite store's driver better-sqlite3 is installed, but its native module did not load \(Could not locate the bindings file\. Tried:\)\. Rebuild it for this Node\.js \(v\d+.*\): npm rebuild better-sqlite3\.$/,
    )
  })

  it('passes any other error through, and does not blame the driver for a module it imports', () => {
    const other = Object.assign(new Error("Cannot find package 'pg-types' imported from /app/node_modules/pg/lib/index.js"), {
      code: 'ERR_MODULE_NOT_FOUND',
    })
    expect(driverError('postgres', 'pg', other)).toBe(other)
  })
})
