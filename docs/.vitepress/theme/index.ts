/**
 * The site's theme: VitePress's default theme, with the Mermaid component replaced by one that draws
 * diagrams one at a time (./render-queue.ts).
 */
import type { Theme } from 'vitepress'
import DefaultTheme from 'vitepress/theme'
import Mermaid from './Mermaid.vue'

export default {
  extends: DefaultTheme,
  enhanceApp({ app }) {
    app.component('Mermaid', Mermaid)
  },
} satisfies Theme
