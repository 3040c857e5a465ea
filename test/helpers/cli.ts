import { spawn } from 'node:child_process'

/** What a finished child process printed, and how it exited. */
export interface CliResult {
  /** Exit code; `null` when a signal ended it. */
  code: number | null
  stdout: string
  stderr: string
}

/**
 * Runs `node <args>` (this process's Node, or `options.node`) to its end, stdin closed (not a terminal), and collects its
 * output. Asynchronous on purpose: a vitest worker blocked in `spawnSync` cannot answer the runner's
 * RPC, and on a loaded machine a few CLI runs in a row outlast its fixed 60 s timeout ("Timeout calling
 * onTaskUpdate", which fails the whole run with every test green).
 */
export function runNode(
  args: readonly string[],
  options: { cwd?: string; env?: NodeJS.ProcessEnv; input?: string; node?: string } = {},
): Promise<CliResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(options.node ?? process.execPath, args, {
      cwd: options.cwd,
      env: options.env ?? process.env,
      stdio: ['pipe', 'pipe', 'pipe'],
    })
    let stdout = ''
    let stderr = ''
    child.stdout.setEncoding('utf8').on('data', (chunk: string) => {
      stdout += chunk
    })
    child.stderr.setEncoding('utf8').on('data', (chunk: string) => {
      stderr += chunk
    })
    child.on('error', reject)
    child.on('close', (code) => resolve({ code, stdout, stderr }))
    child.stdin.end(options.input ?? '')
  })
}
