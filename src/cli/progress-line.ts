/**
 * A progress bar on one terminal line (` bare      API |████░░░░| 120/300 intents`), redrawn in place
 * at most every {@link REDRAW_MS}, with the cursor hidden while it runs.
 */

/** Cells of the bar. */
const BAR_CELLS = 40
/** Redraws at most this often; the last value is always drawn on stop. */
const REDRAW_MS = 100

/** A bar for one count at a time: `start` a count, `update` it, `stop` to leave the line as it ends. */
export interface ProgressLine {
  start(total: number, label: string): void
  update(value: number): void
  stop(): void
}

/** @example const bar = progressLine(process.stderr); bar.start(300, 'bare     '); bar.update(120); bar.stop() */
export function progressLine(stream: NodeJS.WriteStream): ProgressLine {
  let total = 0
  let value = 0
  let label = ''
  let drawnAt = 0
  let running = false
  const draw = () => {
    const filled = total > 0 ? Math.min(BAR_CELLS, Math.round((value / total) * BAR_CELLS)) : 0
    stream.write(`\r ${label} API |${'\u2588'.repeat(filled)}${'\u2591'.repeat(BAR_CELLS - filled)}| ${value}/${total} intents\u001b[K`)
    drawnAt = performance.now()
  }
  return {
    start(count, name) {
      total = count
      value = 0
      label = name
      if (!running) stream.write('\u001b[?25l')
      running = true
      draw()
    },
    update(done) {
      value = done
      if (performance.now() - drawnAt >= REDRAW_MS || done >= total) draw()
    },
    stop() {
      if (!running) return
      running = false
      draw()
      stream.write('\n\u001b[?25h')
    },
  }
}
