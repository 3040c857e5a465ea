/**
 * TypeDoc options for the site's API reference (docs/api/, generated at build time, not committed):
 * one entry point per public subpath of package.json "exports" (the publishers/* aliases name the same
 * modules as the broker subpaths, so they are left out), Markdown output shaped for VitePress.
 */
import { readFileSync } from 'node:fs'

const pkg = JSON.parse(readFileSync(new URL('./package.json', import.meta.url), 'utf8'))

/** `./dist/backends/memory/index.d.ts` -> `./src/backends/memory/index.ts`. */
export const entryPoints = Object.entries(pkg.exports)
  .filter(([subpath, target]) => typeof target === 'object' && !subpath.startsWith('./publishers/'))
  .map(([, target]) => target.import.types.replace(/^\.\/dist\//, './src/').replace(/\.d\.ts$/, '.ts'))

/** @type {import('typedoc').TypeDocOptions & import('typedoc-plugin-markdown').PluginOptions} */
export default {
  entryPoints,
  tsconfig: './tsconfig.build.json',
  out: './docs/api',
  plugin: ['typedoc-plugin-markdown', 'typedoc-vitepress-theme'],
  docsRoot: './docs',
  readme: 'none',
  excludePrivate: true,
  excludeInternal: true,
  hideGenerator: true,
  skipErrorChecking: true,
  validation: { notExported: false, invalidLink: false, notDocumented: false },
}
