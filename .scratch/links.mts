import { readFileSync, existsSync, readdirSync } from 'node:fs'
import { dirname, join, normalize } from 'node:path'
const walk = (d: string): string[] => readdirSync(d, { withFileTypes: true }).flatMap(e => e.isDirectory() ? walk(join(d, e.name)) : e.name.endsWith('.md') ? [join(d, e.name)] : [])
const files = ['README.md', ...walk('docs')]
const slug = (h: string) => h.trim().toLowerCase().replace(/<[^>]+>/g,'').replace(/[^\p{L}\p{N}\s_-]/gu, '').replace(/\s/g, '-')
const anchors = (f: string) => { const text = readFileSync(f,'utf8').replace(/```[\s\S]*?```/g,''); const seen = new Map<string, number>(); const out = new Set<string>(); for (const m of text.matchAll(/^#{1,6} (.+)$/gm)) { const s = slug(m[1]!); const n = seen.get(s) ?? 0; out.add(n ? `${s}-${n}` : s); seen.set(s, n+1) } return out }
for (const f of files) {
  const text = readFileSync(f, 'utf8').replace(/```[\s\S]*?```/g,'')
  for (const m of text.matchAll(/\]\(([^)\s]+)\)/g)) {
    const link = m[1]!; if (/^[a-z]+:/.test(link)) continue
    const [path, anchor] = link.split('#')
    const target = path ? normalize(join(dirname(f), path)) : f
    if (!existsSync(target)) { console.log(`${f}: ${link}: no file`); continue }
    if (anchor && target.endsWith('.md') && !anchors(target).has(anchor)) console.log(`${f}: ${link}: no anchor`)
  }
}
