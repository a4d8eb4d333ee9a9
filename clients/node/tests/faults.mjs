// Fault tools for the tests (TESTING.md): a TCP proxy that can reset every connection
// through it while both ends stay alive, and the history checker of holding intervals.
import { createConnection, createServer } from 'node:net';

/** A loopback TCP proxy to `target` ('host:port'). `reset()` breaks every connection
 * through it with a TCP RST each way, as a broken network does; new connections are
 * accepted and forwarded as before. */
export class TcpProxy {
  static start(target) {
    const proxy = new TcpProxy();
    const [host, port] = [target.slice(0, target.lastIndexOf(':')), Number(target.slice(target.lastIndexOf(':') + 1))];
    proxy.pairs = new Set();
    proxy.server = createServer((client) => {
      const upstream = createConnection({ host, port });
      const pair = [client, upstream];
      proxy.pairs.add(pair);
      client.pipe(upstream);
      upstream.pipe(client);
      const drop = () => {
        proxy.pairs.delete(pair);
        client.destroy();
        upstream.destroy();
      };
      for (const socket of pair) {
        socket.on('error', drop);
        socket.on('close', drop);
      }
    });
    return new Promise((resolve, reject) => {
      proxy.server.once('error', reject);
      proxy.server.listen(0, '127.0.0.1', () => {
        proxy.addr = `127.0.0.1:${proxy.server.address().port}`;
        resolve(proxy);
      });
    });
  }

  /** How many connections pass through now. */
  get connections() {
    return this.pairs.size;
  }

  /** Resets every connection, both sides, at once. */
  reset() {
    const pairs = [...this.pairs];
    this.pairs.clear();
    for (const [client, upstream] of pairs) {
      client.resetAndDestroy();
      upstream.resetAndDestroy();
    }
    return pairs.length;
  }

  close() {
    this.reset();
    return new Promise((resolve) => this.server.close(() => resolve()));
  }
}

/** Milliseconds on this process's monotonic clock: every stamp of a history comes from it. */
export const now = () => performance.now();

/**
 * Holding intervals of one key, stamped on one monotonic clock: `t_ack` when a grant
 * (or a restore) arrives, before first use; `t_end` when the holder is told to stop
 * (suspended, lost) or before its release is sent.
 */
export class History {
  intervals = [];
  grants = [];

  /** A grant arrived: the start of an interval of `who`, and a token to check. */
  granted(who, token) {
    this.grants.push({ who, token, at: now() });
    return this.start(who, token);
  }

  /** An interval of `who` starts now (a grant, or a restored lock); returns its end(). */
  start(who, token) {
    const interval = { who, token, start: now(), end: undefined };
    this.intervals.push(interval);
    return (why) => {
      if (interval.end === undefined) {
        interval.end = now();
        interval.why = why;
      }
    };
  }

  /** Overlaps: sorted by start, an interval that starts before the running maximum end
   * (an interval not ended yet counts as running forever). */
  overlaps() {
    const sorted = [...this.intervals].sort((a, b) => a.start - b.start);
    const found = [];
    let last;
    for (const i of sorted) {
      if (last && i.start < (last.end ?? Infinity)) {
        found.push(`${last.who} [${last.start.toFixed(1)}, ${last.end?.toFixed(1) ?? '...'}] (ended: ${last.why ?? 'not yet'}) ` +
          `overlaps ${i.who} from ${i.start.toFixed(1)} by ${((last.end ?? Infinity) - i.start).toFixed(1)} ms`);
      }
      if (!last || (i.end ?? Infinity) > (last.end ?? Infinity)) last = i;
    }
    return found;
  }

  /** Token regressions: tokens must strictly increase in grant order. */
  regressions() {
    const found = [];
    for (let i = 1; i < this.grants.length; i++) {
      if (this.grants[i].token <= this.grants[i - 1].token) {
        found.push(`${this.grants[i].who} got ${this.grants[i].token} after ${this.grants[i - 1].who}'s ${this.grants[i - 1].token}`);
      }
    }
    return found;
  }
}
