import { bodyPreview } from './output.js'

describe('bodyPreview', () => {
  it('previews a UTF-8 text body whose 480th byte falls inside a character, rather than call it binary', () => {
    // 'a' then 3-byte characters: byte 480 (where the preview stops reading) splits a '€'.
    const body = new TextEncoder().encode(`a${'€'.repeat(200)}`)
    expect(bodyPreview(body)).toBe(`a${'€'.repeat(116)}...`)
  })

  it('still calls a body binary when it is not UTF-8, or holds control characters', () => {
    expect(bodyPreview(new Uint8Array([0xff, 0xfe, 0x00, 0x41]))).toBeNull()
    expect(bodyPreview(new TextEncoder().encode('PK\u0003\u0004zip'))).toBeNull()
  })
})
