/**
 * Exact decimals for canonical JSON: a number's canonical text from its digits, never through a double,
 * laid out as ECMAScript's `Number::toString` lays out its digits.
 */

const ZERO = 0x30
const NINE = 0x39

/**
 * The canonical text of int.frac × 10^±exp, from its digits in s. `exp` has no leading zeros and may
 * be any length: an exponent of more than 15 digits is carried as a string, so that `1e` followed by a
 * million nines costs linear time, not BigInt's quadratic parse.
 */
export function decimal(
  negative: boolean,
  s: string,
  intStart: number,
  intEnd: number,
  fracStart: number,
  fracEnd: number,
  expNegative: boolean,
  exp: string,
): string {
  const all = s.slice(intStart, intEnd) + s.slice(fracStart, fracEnd)
  let a = 0
  while (a < all.length && all.charCodeAt(a) === ZERO) a++
  if (a === all.length) return '0'
  let b = all.length
  while (all.charCodeAt(b - 1) === ZERO) b--
  const digits = all.slice(a, b)
  // value = digits × 10^(exp − fraction digits + trailing zeros dropped); n = where the point goes.
  const shift = digits.length - (fracEnd - fracStart) + (all.length - b)
  if (exp.length <= 15) return layout(negative, digits, shift + (expNegative ? -Number(exp) : Number(exp)))
  // |exp| ≥ 10^15 dwarfs the shift (bounded by the text's length): always the exponential form, with
  // exponent n − 1 = ±exp + shift − 1, whose sign is the sign of exp.
  const magnitude = addSmall(exp, expNegative ? 1 - shift : shift - 1)
  return (negative ? '-' : '') + mantissa(digits) + (expNegative ? 'e-' : 'e+') + magnitude
}

/** digits + delta, for a digit string of 16 or more digits without leading zeros and |delta| < 2^31. */
function addSmall(digits: string, delta: number): string {
  let head = digits.slice(0, -15)
  let tail = Number(digits.slice(-15)) + delta
  if (tail < 0) {
    tail += 1e15
    head = step(head, -1)
  } else if (tail >= 1e15) {
    tail -= 1e15
    head = step(head, 1)
  }
  return head === '' ? String(tail) : head + String(tail).padStart(15, '0')
}

/** A positive decimal digit string plus or minus one, without leading zeros ('' for zero). */
function step(digits: string, by: 1 | -1): string {
  const from = by === 1 ? NINE : ZERO
  let k = digits.length - 1
  while (k >= 0 && digits.charCodeAt(k) === from) k--
  const rest = (by === 1 ? '0' : '9').repeat(digits.length - 1 - k)
  if (k < 0) return '1' + rest // only when adding: 999 + 1
  const out = digits.slice(0, k) + String.fromCharCode(digits.charCodeAt(k) + by) + rest
  let lead = 0
  while (lead < out.length && out.charCodeAt(lead) === ZERO) lead++
  return out.slice(lead)
}

function mantissa(digits: string): string {
  return digits.length === 1 ? digits : digits[0] + '.' + digits.slice(1)
}

/**
 * ECMAScript Number::toString's layout (ECMA-262 §6.1.6.1.20) of digits × 10^(n − k) for any number
 * of digits k: what JSON.stringify writes for a double, applied to the exact decimal.
 */
function layout(negative: boolean, digits: string, n: number): string {
  const k = digits.length
  let out: string
  if (k <= n && n <= 21) out = digits + '0'.repeat(n - k)
  else if (0 < n && n <= 21) out = digits.slice(0, n) + '.' + digits.slice(n)
  else if (-6 < n && n <= 0) out = '0.' + '0'.repeat(-n) + digits
  else out = mantissa(digits) + (n - 1 < 0 ? 'e-' + String(1 - n) : 'e+' + String(n - 1))
  return negative ? '-' + out : out
}

/** The canonical text of a bigint: the number it is, laid out like any other. */
export function bigintText(value: bigint): string {
  const text = value < 0n ? (-value).toString() : value.toString()
  if (text === '0') return '0'
  let end = text.length
  while (text.charCodeAt(end - 1) === ZERO) end--
  return layout(value < 0n, text.slice(0, end), text.length)
}
