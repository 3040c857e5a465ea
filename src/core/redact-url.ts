/**
 * A URL as messages and logs may show it: its password, if it has one, replaced by `***`. Works on text
 * that does not parse as a URL too, since that is the text an error message about a bad URL echoes.
 *
 * A password may hold an unescaped `@`, `/`, `?` or `#`, and then where it ends is a guess (a parser
 * may read part of it as the host, or refuse the text): so once the text has a user part, or does not
 * parse, the mask runs to its last `@`. That may hide more than the password, never less.
 *
 * @example redactUrl('postgres://app:s3cret@db:5432/app') // 'postgres://app:***@db:5432/app'
 * @example redactUrl('amqp://guest:p/w@127.0.0.1') // 'amqp://guest:***@127.0.0.1'
 */
export function redactUrl(text: string): string {
  const start = text.indexOf('//')
  if (start < 0) return text
  const from = start + 2
  // Where a URL parser ends the authority (user, password, host, port): the first / ? or # after the //.
  const rest = text.slice(from).search(/[/?#]/)
  const end = rest < 0 ? text.length : from + rest
  const userPart = text.lastIndexOf('@', end - 1) >= from
  const at = userPart || !URL.canParse(text) ? text.lastIndexOf('@') : -1
  if (at < from) return text
  const colon = text.indexOf(':', from)
  if (colon < 0 || colon > at) return text
  return `${text.slice(0, colon + 1)}***${text.slice(at)}`
}
