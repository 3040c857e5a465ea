/**
 * Mermaid diagrams drawn one at a time, each under an id of its own. vitepress-plugin-mermaid's own
 * component draws every diagram of a page at once, again at each attribute change of <html> (which
 * VitePress makes while a page loads), all under the same ids: on a busy machine those draws overlap and
 * end as Mermaid's "Syntax error" picture. Queued, a diagram is drawn once, and again only when the
 * colour scheme really changed.
 */
let queue: Promise<unknown> = Promise.resolve()
let drawn = 0

/** The SVG of `code`, in the dark or the light theme, after the draws asked for before it. */
export function renderDiagram(code: string, dark: boolean): Promise<string> {
  const draw = async () => {
    const { default: mermaid } = await import('mermaid')
    mermaid.initialize({ startOnLoad: false, securityLevel: 'strict', theme: dark ? 'dark' : 'default' })
    drawn += 1
    const { svg } = await mermaid.render(`idemkey-diagram-${drawn}`, code)
    return svg
  }
  const result = queue.then(draw, draw)
  queue = result.catch(() => undefined)
  return result
}
