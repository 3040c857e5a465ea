/** A multipart upload for the tests of the adapters mounted before a multipart parser (multer, @koa/multer). */

/** An encoded form: its content type (with the boundary) and its bytes. */
export interface EncodedForm {
  type: string
  bytes: ArrayBuffer
}

/** A form with a `title` field and a text `file`, made once: a retry sends the same bytes (a new FormData would draw a new boundary). */
export async function encodedForm(text: string): Promise<EncodedForm> {
  const form = new FormData()
  form.set('title', 'report')
  form.set('file', new Blob([text], { type: 'text/plain' }), 'report.txt')
  const request = new Request('http://x/', { method: 'POST', body: form })
  return { type: request.headers.get('content-type') as string, bytes: await request.arrayBuffer() }
}

/** POSTs the form under an idempotency key; the answer's status, replay header and body text. */
export async function postForm(url: string, key: string, form: EncodedForm) {
  const response = await fetch(url, {
    method: 'POST',
    headers: { 'idempotency-key': key, 'content-type': form.type },
    body: form.bytes,
    signal: AbortSignal.timeout(5_000),
  })
  return { status: response.status, replayed: response.headers.get('idempotent-replayed'), text: await response.text() }
}
