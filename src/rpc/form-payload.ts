/**
 * What a form asks for, as the RPC adapters fingerprint it (docs/rpc.md): a Next.js action's form, a
 * tRPC FormData input. A form is no JSON (it is `{}` to `JSON.stringify`), so its entries are taken one
 * by one: text as it is, a file by name, type, size and a SHA-256 of its bytes (another file of the same
 * name and size is another form).
 */
import { sha256Hex } from '../core/fingerprint.js'

/** A file by what tells it apart from another: name, type, size and a SHA-256 of its bytes. */
export async function filePayload(file: Blob): Promise<{ file: string | undefined; type: string; size: number; sha256: string }> {
  return {
    file: file instanceof File ? file.name : undefined,
    type: file.type,
    size: file.size,
    sha256: sha256Hex(new Uint8Array(await file.arrayBuffer())),
  }
}

/**
 * The form's entries in order, without those `skip` names (the key's own field, Next.js's `$ACTION_`
 * fields).
 *
 * @example await formPayload(form, (name) => name === 'idempotencyKey') // [['sku', 'A-1'], ['doc', { file, type, size, sha256 }]]
 */
export async function formPayload(form: FormData, skip: (name: string) => boolean = () => false): Promise<Array<[string, unknown]>> {
  const entries: Array<[string, unknown]> = []
  for (const [name, value] of form.entries()) {
    if (skip(name)) continue
    entries.push([name, typeof value === 'string' ? value : await filePayload(value)])
  }
  return entries
}
