/**
 * Mermaid diagrams drawn one at a time, each under an id of its own. vitepress-plugin-mermaid's own
 * component draws every diagram of a page at once, again at each attribute change of <html> (which
 * VitePress makes while a page loads), all under the same ids: on a busy machine those draws overlap and
 * end as Mermaid's "Syntax error" picture. Queued, a diagram is drawn once, and again only when the
 * colour scheme really changed.
 *
 * Mermaid is told never to draw its error picture (`suppressErrorRendering`): a draw that fails is
 * tried again (a loaded machine has been seen to fail one that then draws), and one that keeps failing
 * rejects, so the page shows the diagram's source and the console says why, never a picture that
 * blames the reader's text.
 */
let queue: Promise<unknown> = Promise.resolve()
let drawn = 0

/** How many times a diagram is tried before its source is shown instead. */
const ATTEMPTS = 3

/** The SVG of `code`, in the dark or the light theme, after the draws asked for before it. */
export function renderDiagram(code: string, dark: boolean): Promise<string> {
  const draw = async () => {
    const { default: mermaid } = await import('mermaid')
    let failure: unknown
    for (let attempt = 1; attempt <= ATTEMPTS; attempt += 1) {
      mermaid.initialize({
        startOnLoad: false,
        securityLevel: 'strict',
        suppressErrorRendering: true,
        theme: dark ? 'dark' : 'default',
      })
      drawn += 1
      try {
        const { svg } = await mermaid.render(`idemkey-diagram-${drawn}`, code)
        return svg
      } catch (error) {
        failure = error
        console.warn(`idemkey docs: drawing a Mermaid diagram failed (attempt ${attempt} of ${ATTEMPTS})`, error)
      }
    }
    throw failure
  }
  const result = queue.then(draw, draw)
  queue = result.catch(() => undefined)
  return result
}
