/**
 * Runs `round` (one race of several processes over the same keys, which asserts exactly-once itself
 * and returns how many processes won keys) until the processes really raced, at most `rounds` times.
 * A round in which one process swept every key before the others started (a loaded machine) proved
 * nothing about racing; exactly-once is still checked in it.
 */
export async function expectRaced(round: () => Promise<number>, rounds = 3): Promise<void> {
  for (let i = 1; ; i++) {
    const racing = await round()
    if (racing > 1 || i === rounds) {
      expect(racing, 'processes that won keys: they really raced').toBeGreaterThan(1)
      return
    }
  }
}
