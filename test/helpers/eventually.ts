/**
 * Polls `check` every `everyMs` until it returns true; fails with `what` after `timeoutMs` (a deadline,
 * not a timed assertion).
 */
export async function eventually(check: () => Promise<boolean> | boolean, what: string, timeoutMs = 30_000, everyMs = 50): Promise<void> {
  const end = Date.now() + timeoutMs
  while (Date.now() < end) {
    if (await check()) return
    await new Promise((resolve) => setTimeout(resolve, everyMs))
  }
  throw new Error(`Timed out after ${timeoutMs} ms waiting for: ${what}`)
}
