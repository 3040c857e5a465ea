/**
 * The sidebar, read from the file system at build time: the pages at the top of docs/ form one group,
 * each folder under docs/ another (quick starts, guides, reference, benchmarks...), and the API
 * reference TypeDoc writes to docs/api/ its own. A page's title is its first `# ` heading, so a page
 * added to a folder appears in the sidebar with no edit here, and a folder that does not exist yet is
 * simply absent.
 */
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs'
import { basename, join } from 'node:path'
import type { DefaultTheme } from 'vitepress'

/** Folders with a fixed place and name; any other folder follows them, named after itself. */
const KNOWN: Record<string, string> = {
  'quick-starts': 'Quick starts',
  guides: 'Guides',
  reference: 'Reference',
  benchmarks: 'Benchmark reports',
}

/** Folders that are not pages for the sidebar: the site's own, and the generated API (its own group). */
const SKIP = new Set(['.vitepress', 'api', 'public', 'node_modules'])

/** The text of a page's first `# ` heading outside code fences, inline Markdown stripped; else its file name. */
export function pageTitle(file: string): string {
  let fenced = false
  for (const line of readFileSync(file, 'utf8').split('\n')) {
    if (/^\s*(```|~~~)/.test(line)) fenced = !fenced
    if (fenced) continue
    const heading = /^# (.+)$/.exec(line)
    if (heading?.[1]) {
      return heading[1]
        .replace(/\[([^\]]*)\]\([^)]*\)/g, '$1')
        .replace(/[`*_]/g, '')
        .trim()
    }
  }
  return basename(file, '.md')
}

/** The site link of a Markdown file relative to docs/: `guides/x.md` -> `/guides/x`; an index -> its folder. */
function link(relative: string): string {
  const path = relative.replace(/\.md$/, '')
  return `/${path.replace(/(^|\/)index$/, '$1')}`
}

/** The pages of one folder, the folder's README or index first, then by title. */
function pages(docs: string, folder: string): DefaultTheme.SidebarItem[] {
  const dir = join(docs, folder)
  const files = readdirSync(dir).filter((name) => name.endsWith('.md') && statSync(join(dir, name)).isFile())
  const items = files.map((name) => {
    const relative = folder ? `${folder}/${name}` : name
    return { text: pageTitle(join(dir, name)), link: link(relative), first: /^(README|index)\.md$/.test(name) }
  })
  items.sort((a, b) => Number(b.first) - Number(a.first) || a.text.localeCompare(b.text))
  // The home page is reached from the title; it is not a sidebar entry.
  return items.filter((item) => !(folder === '' && item.link === '/')).map(({ text, link }) => ({ text, link }))
}

/** A module's entry without its members: each module page lists them, and every page carries the sidebar. */
function modulesOnly(item: DefaultTheme.SidebarItem): DefaultTheme.SidebarItem {
  if (item.link) return { text: item.text, link: item.link }
  return { ...item, collapsed: false, items: (item.items ?? []).map(modulesOnly) }
}

/**
 * The API sidebar: TypeDoc's (typedoc-vitepress-theme writes it next to the API pages, when it was
 * generated), cut to one entry per module, under an entry for the reference's index.
 */
export function apiSidebar(docs: string): DefaultTheme.SidebarItem[] {
  const file = join(docs, 'api', 'typedoc-sidebar.json')
  if (!existsSync(file)) return []
  const items = (JSON.parse(readFileSync(file, 'utf8')) as DefaultTheme.SidebarItem[]).map(modulesOnly)
  return [{ text: 'API reference', link: '/api/', items }]
}

/** Every group, in reading order: quick starts, guides, the topic pages, reference, the rest, the API. */
export function sidebar(docs: string): DefaultTheme.SidebarItem[] {
  const folders = readdirSync(docs)
    .filter((name) => !SKIP.has(name) && !name.startsWith('.') && statSync(join(docs, name)).isDirectory())
    .filter((name) => pages(docs, name).length > 0)
  const order = (name: string) => {
    const index = Object.keys(KNOWN).indexOf(name)
    return index === -1 ? Object.keys(KNOWN).length : index
  }
  folders.sort((a, b) => order(a) - order(b) || a.localeCompare(b))
  const group = (name: string): DefaultTheme.SidebarItem => ({
    text: KNOWN[name] ?? name.replace(/[-_]/g, ' ').replace(/^./, (c) => c.toUpperCase()),
    collapsed: name === 'benchmarks',
    items: pages(docs, name),
  })
  const groups: DefaultTheme.SidebarItem[] = []
  for (const name of folders.filter((name) => order(name) < 2)) groups.push(group(name))
  groups.push({ text: 'Topics', items: pages(docs, '') })
  for (const name of folders.filter((name) => order(name) >= 2)) groups.push(group(name))
  if (existsSync(join(docs, 'api', 'index.md'))) groups.push({ text: 'API reference', link: '/api/' })
  return groups
}

/** The folders that exist, for the top navigation: a nav entry links to a folder's first page. */
export function firstPage(docs: string, folder: string): string | undefined {
  if (!existsSync(join(docs, folder))) return undefined
  return pages(docs, folder)[0]?.link
}
