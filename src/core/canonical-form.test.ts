import { canonicalForm } from './canonical-form.js'

const form = (text: string) => canonicalForm(Buffer.from(text, 'latin1'))

describe('canonicalForm', () => {
  it('gives one text for the same fields in any order and any percent-encoding', () => {
    const spellings = [
      'amount=100&currency=usd&description=hello%20world',
      'description=hello+world&currency=usd&amount=100',
      'currency=%75sd&description=hello%20world&amount=%31%30%30',
      'amount=100&&currency=usd&description=hello+world&',
    ]
    expect(new Set(spellings.map(form)).size).toBe(1)
  })

  it('tells apart different values, names, and a plus from an encoded plus', () => {
    const texts = ['a=1', 'a=2', 'b=1', 'a=1&b=', 'a=%2B', 'a=+', 'a=%C3%A9', 'a=%E9']
    expect(new Set(texts.map(form)).size).toBe(texts.length)
  })

  it('reads a name without = as an empty value, as the URL standard and body parsers do', () => {
    expect(form('a&b=1')).toBe(form('b=1&a='))
  })

  it('keeps the order of pairs that share a name base, and of bracketed names: parsers build arrays from it', () => {
    expect(form('a[]=1&a[]=2')).not.toBe(form('a[]=2&a[]=1'))
    expect(form('tag=x&tag=y')).not.toBe(form('tag=y&tag=x'))
    expect(form('a=1&a[]=2')).not.toBe(form('a[]=2&a=1'))
    expect(form('a[]=1&b=0&a[]=2')).toBe(form('b=0&a[]=1&a[]=2'))
    expect(form('metadata[x]=1&amount=5&metadata[y]=2')).toBe(form('amount=5&metadata[x]=1&metadata[y]=2'))
  })

  it('keeps a % that starts no escape as it is, like the URL standard', () => {
    expect(form('a=%zz')).toBe(form('a=%25zz'))
    expect(form('a=100%')).toBe(form('a=100%25'))
  })
})
