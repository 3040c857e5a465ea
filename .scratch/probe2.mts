import ts from 'typescript'
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
const ROOT = process.cwd()
const pkg = JSON.parse(readFileSync('package.json','utf8'))
const files: [string,string][] = []
for (const [k,v] of Object.entries<any>(pkg.exports)) { if (k==='./package.json') continue
  const built = v.import.types as string
  files.push([k==='.'?'idemkey':`idemkey/${k.slice(2)}`, join(ROOT, built.replace(/^\.\/dist\//,'src/').replace(/\.d\.ts$/,'.ts'))]) }
const program = ts.createProgram(files.map(f=>f[1]), { strict: true, target: ts.ScriptTarget.ES2022, module: ts.ModuleKind.NodeNext, moduleResolution: ts.ModuleResolutionKind.NodeNext, skipLibCheck: true, noEmit: true })
const checker = program.getTypeChecker()
const seen = new Map<string,string>()
let n=0
for (const [spec, file] of files) {
  const sf = program.getSourceFile(file)!; const mod = checker.getSymbolAtLocation(sf)!
  for (let s of checker.getExportsOfModule(mod)) {
    if (!/Options$/.test(s.name)) continue
    if (s.flags & ts.SymbolFlags.Alias) s = checker.getAliasedSymbol(s)
    const decl = s.declarations?.[0]; if (!decl) continue
    const key = decl.getSourceFile().fileName + '#' + s.name
    if (seen.has(key)) continue; seen.set(key, spec)
    const type = checker.getDeclaredTypeOfSymbol(s)
    const props = checker.getPropertiesOfType(type)
    n+=props.length
    console.log(spec, s.name, ts.SyntaxKind[decl.kind], props.length, type.isUnion()? 'UNION':'')
  }
}
console.log('total', n)
