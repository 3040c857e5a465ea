import { type ChildProcess, fork } from 'node:child_process'
import type { WorkerConfig, WorkerMessage } from './payments-api.js'

interface Slot {
  child: ChildProcess | undefined
  origin: string | undefined
  ready: Promise<string>
}

/**
 * N worker processes serving one API. A worker that dies (the crash fault SIGKILLs it) is
 * restarted at once; requests wait for a live one.
 */
export class WorkerPool {
  /** How many times a worker died and was restarted. */
  restarts = 0
  readonly #slots: Slot[] = []
  readonly #config: WorkerConfig
  readonly #entry: URL
  #next = 0
  #stopping = false

  constructor(entry: URL, config: WorkerConfig, size: number) {
    this.#entry = entry
    this.#config = config
    for (let i = 0; i < size; i++) {
      const slot: Slot = { child: undefined, origin: undefined, ready: Promise.resolve('') }
      this.#slots.push(slot)
      this.#start(slot)
    }
  }

  /** Resolves once every worker listens; rejects when one fails to start. */
  async ready(): Promise<void> {
    await Promise.all(this.#slots.map((slot) => slot.ready))
  }

  /** The origin of the next worker, round robin; waits while that worker restarts. */
  pick(): Promise<string> {
    const slot = this.#slots[this.#next++ % this.#slots.length] as Slot
    return slot.origin ? Promise.resolve(slot.origin) : slot.ready
  }

  #start(slot: Slot): void {
    const child = fork(this.#entry, [], {
      env: { ...process.env, IDEMKEY_DEMO_WORKER: JSON.stringify(this.#config) },
      stdio: ['ignore', 'ignore', 'inherit', 'ipc'],
    })
    slot.child = child
    slot.origin = undefined
    slot.ready = new Promise<string>((resolve, reject) => {
      child.on('message', (message: WorkerMessage) => {
        if (message.type === 'ready') {
          slot.origin = `http://127.0.0.1:${message.port}`
          resolve(slot.origin)
        } else reject(new Error(`A demo worker failed to start: ${message.message}`))
      })
      child.once('exit', (code, signal) => {
        slot.origin = undefined
        if (this.#stopping) return
        if (signal === 'SIGKILL') {
          this.restarts++
          this.#start(slot)
          // Requests waiting on this slot follow the restarted worker.
          slot.ready.then(resolve, reject)
        } else reject(new Error(`A demo worker exited unexpectedly (code ${code}, signal ${signal}).`))
      })
    })
    slot.ready.catch(() => {})
  }

  /** Stops every worker. */
  async stop(): Promise<void> {
    this.#stopping = true
    await Promise.all(
      this.#slots.map(
        (slot) =>
          new Promise<void>((resolve) => {
            const child = slot.child
            if (!child || child.exitCode !== null || child.signalCode !== null) return resolve()
            child.once('exit', () => resolve())
            child.kill('SIGTERM')
          }),
      ),
    )
  }
}
