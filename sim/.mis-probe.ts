import { Misuse } from './misuse.ts'
const seeds = Number(process.argv[2] ?? 200)
const seen = new Map<string, number>()
const t = performance.now()
for (let seed = 1; seed <= seeds; seed++) {
  await new Misuse(seed, (v) => { const k = v.slice(0, 160); if (!seen.has(k)) console.log(seed, v.slice(0, 400)); seen.set(k, (seen.get(k) ?? 0) + 1) }).run(4)
}
console.log('ms/seed', ((performance.now() - t) / seeds).toFixed(2), 'violations', [...seen.values()].reduce((a, b) => a + b, 0))
