/**
 * The canonical form of an `application/x-www-form-urlencoded` body (docs/http.md, "Fingerprints"): the
 * same fields spelled differently (`%20` or `+`, `%41` or `A`, fields in another order) give the same
 * text, and different fields never do.
 *
 * The body is read as the WHATWG URL standard parses it, on bytes: split on `&` (empty pieces dropped),
 * each piece split at its first `=` (none: an empty value), `+` read as a space, `%XX` decoded (a `%`
 * not followed by two hex digits stays as it is). The pairs are then ordered by their name's base, the
 * part before its first `[`, keeping the order of pairs that share one: body parsers build arrays and
 * nested objects from those in order (`a[]=1&a[]=2` is not `a[]=2&a[]=1`, and qs folds `a` and `a[]` into
 * one array), while fields of different names are read by name. Each name and value is written back
 * percent-encoding every byte but `A-Z a-z 0-9 - . _ ~`.
 */

const AMPERSAND = 0x26
const EQUALS = 0x3d
const PLUS = 0x2b
const PERCENT = 0x25
const BRACKET = 0x5b

/** The canonical text of a form body's bytes. */
export function canonicalForm(body: Uint8Array): string {
  const pairs: Array<{ base: string; text: string }> = []
  let start = 0
  while (start <= body.length) {
    let end = body.indexOf(AMPERSAND, start)
    if (end === -1) end = body.length
    if (end > start) {
      const piece = body.subarray(start, end)
      const equals = piece.indexOf(EQUALS)
      const name = decode(equals === -1 ? piece : piece.subarray(0, equals))
      const value = decode(equals === -1 ? new Uint8Array(0) : piece.subarray(equals + 1))
      const bracket = name.indexOf(BRACKET)
      pairs.push({ base: encode(bracket === -1 ? name : name.subarray(0, bracket)), text: `${encode(name)}=${encode(value)}` })
    }
    start = end + 1
  }
  // Array.prototype.sort is stable: pairs of one base keep their order. Encoded bases compare as their bytes do.
  pairs.sort((a, b) => (a.base < b.base ? -1 : a.base > b.base ? 1 : 0))
  return pairs.map((pair) => pair.text).join('&')
}

function hexValue(byte: number | undefined): number {
  if (byte === undefined) return -1
  if (byte >= 0x30 && byte <= 0x39) return byte - 0x30
  if (byte >= 0x41 && byte <= 0x46) return byte - 0x37
  if (byte >= 0x61 && byte <= 0x66) return byte - 0x57
  return -1
}

/** `+` as a space, `%XX` as its byte; anything else as it is. */
function decode(bytes: Uint8Array): Uint8Array {
  const out = new Uint8Array(bytes.length)
  let length = 0
  for (let i = 0; i < bytes.length; i++) {
    const byte = bytes[i] as number
    if (byte === PERCENT) {
      const high = hexValue(bytes[i + 1])
      const low = hexValue(bytes[i + 2])
      if (high !== -1 && low !== -1) {
        out[length++] = high * 16 + low
        i += 2
        continue
      }
    }
    out[length++] = byte === PLUS ? 0x20 : byte
  }
  return out.subarray(0, length)
}

function unreserved(byte: number): boolean {
  return (
    (byte >= 0x41 && byte <= 0x5a) ||
    (byte >= 0x61 && byte <= 0x7a) ||
    (byte >= 0x30 && byte <= 0x39) ||
    byte === 0x2d ||
    byte === 0x2e ||
    byte === 0x5f ||
    byte === 0x7e
  )
}

/** Every byte but the unreserved ones as `%XX` (upper case): one spelling per byte string. */
function encode(bytes: Uint8Array): string {
  let text = ''
  for (const byte of bytes) text += unreserved(byte) ? String.fromCharCode(byte) : `%${byte.toString(16).toUpperCase().padStart(2, '0')}`
  return text
}
