// Timers for delays of any length: one Node timer fires at once (with a warning) when
// asked for more than about 24.8 days, and the seconds callers pass (`connectTimeout`,
// `waitForSidecar`, a lock's TTL) may be longer.

/** The longest delay a Node timer takes: a longer one fires at once, with a
 * TimeoutOverflowWarning. */
export const MAX_TIMER_MS = 2 ** 31 - 1;

/** Calls `fn` after `ms`, also beyond what one Node timer takes (longer delays are
 * waited out in steps); `cancel()` stops it. */
export function later(ms: number, fn: () => void): { cancel(): void } {
  const until = performance.now() + ms;
  let timer: NodeJS.Timeout;
  const arm = () => {
    const left = Math.max(0, until - performance.now());
    timer = left > MAX_TIMER_MS ? setTimeout(arm, MAX_TIMER_MS) : setTimeout(fn, left);
  };
  arm();
  return { cancel: () => clearTimeout(timer) };
}
