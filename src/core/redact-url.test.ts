import { describe, expect, it } from 'vitest'
import { redactUrl } from './redact-url.js'

describe('redactUrl', () => {
  it.each([
    ['postgres://app:s3cret@db:5432/app', 'postgres://app:***@db:5432/app'],
    ['redis://:s3cret@127.0.0.1:6379/0', 'redis://:***@127.0.0.1:6379/0'],
    ['amqps://guest:s3cret@broker?heartbeat=5', 'amqps://guest:***@broker?heartbeat=5'],
  ])('replaces the password of %s', (url, shown) => {
    expect(redactUrl(url)).toBe(shown)
  })

  it.each([
    ['an unescaped @', 'postgres://app:p@ss@db/app'],
    ['an unescaped /', 'postgres://app:p/ss@db/app'],
    ['an unescaped ?', 'mysql://root:p?ss@db/test'],
    ['an unescaped #', 'nats://app:p#ss@127.0.0.1:4222'],
    ['an unescaped @ and /', 'postgres://app:a@b/c@db/app'],
  ])('masks all of a password holding %s', (_, url) => {
    const shown = redactUrl(url)
    expect(shown).not.toMatch(/ss|a@b|b\/c/)
    expect(shown).toContain(':***@')
    expect(shown).toMatch(/@db\/app$|@db\/test$|@127\.0\.0\.1:4222$/)
  })

  it.each([
    'postgres://app@db:5432/app',
    'redis://127.0.0.1:6379/0',
    'redis://127.0.0.1:6379/0?client=a@b',
    'sqlite:idemkey.db',
    'memory:',
    'dynamodb://table?endpoint=http://127.0.0.1:8000',
    '',
  ])('leaves %j as it is: no password', (url) => {
    expect(redactUrl(url)).toBe(url)
  })
})
