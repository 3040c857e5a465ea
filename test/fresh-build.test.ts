import { needsDist } from './setup/fresh-build.js'

describe('test set-up: which runs rebuild dist/ first', () => {
  const files = ['test/cli-proxy.test.ts', 'test/redis-store.test.ts', 'src/core/ledger.test.ts']
  const read = (path: string) =>
    path === 'test/cli-proxy.test.ts' ? "import { BIN } from './helpers/proxy-process.js'" : "import '../src/x.js'"

  it('rebuilds for the whole suite, and for a file filter that selects a test of the built CLI or proxy', () => {
    expect(needsDist([], files, read)).toBe(true)
    expect(needsDist(['run'], files, read)).toBe(true)
    expect(needsDist(['run', 'test/cli-proxy.test.ts'], files, read)).toBe(true)
    expect(needsDist(['run', 'cli-'], files, read)).toBe(true)
  })

  it('does not rebuild for file filters that select only tests of the sources', () => {
    expect(needsDist(['run', 'test/redis-store.test.ts'], files, read)).toBe(false)
    expect(needsDist(['run', 'src/core', '-t', 'replays'], files, read)).toBe(false)
  })

  it('treats option values that match no file as no filter', () => {
    expect(needsDist(['run', '-t', 'takes over'], files, read)).toBe(true)
  })
})
