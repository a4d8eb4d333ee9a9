// The client: the core's client (a channel to the sidecar and the session on it,
// opened on the first `lock()`, opened again after one ends) with Node's idioms:
// Promises, `AbortSignal`s, options checked before anything is sent, and a sidecar
// waited for with one console line.
import { setTimeout as sleep } from 'node:timers/promises';
import { type Description, toDescription } from './description.js';
import { LocksideError, Unavailable, failure, fromNative } from './errors.js';
import { MAX_WAIT_SECONDS, checkSize, checkText, toValue } from './limits.js';
import { Lock, type LockOptions } from './lock.js';
import { type NativeClient, type NativeLock, addon } from './native.js';
import { type LockAllOptions, Locks, checkKeys, keysNamed } from './several.js';

/** Where clients find the sidecar unless told otherwise. */
export const DEFAULT_ADDR = '127.0.0.1:7420';

/** How to campaign for leadership (`client.campaign()`). */
export interface CampaignOptions {
  /** Seconds to wait for leadership; undefined waits as long as the sidecar allows (24 h). */
  wait?: number;
  /** Seconds the store keeps leadership if the sidecar stops renewing it. */
  ttl?: number;
  /** Aborting it gives up the campaign. */
  signal?: AbortSignal;
}

/** TLS to the sidecar (PEM, as `Buffer`s or strings). */
export interface TlsOptions {
  /** The CA that signed the sidecar's certificate; default: the webpki roots. */
  ca?: Buffer | string;
  /** Mutual TLS: this client's certificate chain and its key. */
  cert?: Buffer | string;
  key?: Buffer | string;
  /** The name the sidecar's certificate carries; default: the address's host. */
  serverName?: string;
}

/** How to reach the sidecar. */
export interface ClientOptions {
  /** Sent as `lockside-client-name`; shown by `describe()`. */
  clientName?: string;
  /** Sent as `authorization: Bearer <token>` (the sidecar's `--auth-token-file`). */
  authToken?: string;
  /** TLS to the sidecar; default plaintext (loopback, unix socket). */
  tls?: TlsOptions;
  /** Seconds a sidecar that accepted the connection may take to open a session
   * (default 10). */
  connectTimeout?: number;
  /** Seconds to wait for a sidecar to start listening at the address when a session
   * opens (one console line says so). Default 0: no sidecar there fails at once with
   * `Unavailable` naming the address and the cause (e.g. connection refused). */
  waitForSidecar?: number;
  /** Resume the session when its stream breaks (default true; see `Client`): its locks
   * are suspended meanwhile, and restored if the resumed session lists them. false: a
   * broken stream loses every lock at once. */
  resume?: boolean;
}

const pem = (v: Buffer | string | undefined) => (v === undefined ? undefined : Buffer.from(v));

/** The number of each acquire, so that an aborted one can be given up. */
let nextRequest = 1;

/**
 * A connection to a Lockside sidecar and one session on it. All locks taken through
 * one client share one `Lease` stream, opened on the first `lock()`. Each `lock()` call
 * is a holder of its own inside the session (DESIGN.md, "Holders inside a session"):
 * callers sharing one client exclude each other exactly as separate clients would (a
 * second `lock()` of a held key waits or is BUSY), share a shared key, and take a
 * semaphore permit each. Reentrancy is asked for explicitly: `{ holder: lock.holder }`.
 *
 * The moment the stream breaks (a reset, the sidecar dying, a stall the keepalive
 * notices), every lock of the session is suspended (`Lock`): a live sidecar releases a
 * broken stream's locks at once, and the client cannot tell it from a dead one. If the
 * session holds locks, the client resumes it with its resume token, on the restarted
 * sidecar or any other of the same store and namespace at `addr`, retrying with backoff
 * (also while the sidecar answers that the session is still attached elsewhere): each
 * lock the resumed session lists with its fencing token is restored (the same session
 * id, tokens and hold counts). A lock is lost when it comes back `Lost` or not at all,
 * when resuming is refused for good (the sidecar does not know the session), or when
 * its TTL has passed since the break (the store has let it go); at once when the
 * sidecar's store cannot resume sessions (no resume token: the embedded memory store or Redlock).
 * Waits in progress when the stream breaks reject with `Unavailable` (the sidecar does
 * not resume them); `lock()` calls made while the session resumes wait for it. A
 * session that cannot be resumed, or ends otherwise, loses every lock, and the next
 * `lock()` opens a new session at once. `{ resume: false }` turns resuming off: a
 * break loses every lock at once.
 */
export class Client {
  /** The sidecar's address: `host:port` or `unix:/path`. */
  readonly addr: string;
  private readonly native: NativeClient;
  private readonly waitForSidecar: number;
  /** This client's locks that may still change: told when the client closes. */
  private readonly locks = new Set<Lock>();
  private closed = false;

  /** `addr` defaults to $LOCKSIDE_ADDR, then 127.0.0.1:7420. */
  constructor(addr?: string, options: ClientOptions = {}) {
    this.addr = addr || process.env.LOCKSIDE_ADDR || DEFAULT_ADDR;
    const timing = { connectTimeout: options.connectTimeout ?? 10, waitForSidecar: options.waitForSidecar ?? 0 };
    for (const [name, value] of Object.entries(timing)) {
      if (typeof value !== 'number' || !(value >= 0)) {
        throw new RangeError(`${name} must be a number of seconds >= 0, got ${String(value)}`);
      }
    }
    this.waitForSidecar = timing.waitForSidecar;
    const tls = options.tls && {
      ca: pem(options.tls.ca),
      cert: pem(options.tls.cert),
      key: pem(options.tls.key),
      serverName: options.tls.serverName,
    };
    try {
      this.native = new addon.NativeClient(
        this.addr,
        options.clientName,
        options.authToken,
        tls,
        timing.connectTimeout,
        options.resume ?? true,
      );
    } catch (e) {
      throw fromNative(e, 'connect', '');
    }
  }

  /** The current session's id (as `describe()` shows it); undefined before the first
   * lock and after a session ended. */
  get sessionId(): string | undefined {
    return this.native.sessionId() ?? undefined;
  }

  /**
   * Takes `key` for a new holder (or for `opts.holder`). Rejects with `NotAcquired`
   * (busy, timed out), `Rejected` (a bad value, a conflicting mode or limit, the store
   * unreachable), `Unavailable` (no sidecar), and `TypeError`/`RangeError` for values
   * that are not numbers of seconds.
   */
  async lock(key: string, opts: LockOptions = {}): Promise<Lock> {
    checkText('key', key);
    if (opts.holder !== undefined) checkText('holder', opts.holder);
    const limit = opts.limit ?? 0;
    if (!Number.isInteger(limit) || limit < 0 || limit > 0xffffffff) {
      throw new RangeError(`limit must be an integer between 0 and 2**32-1, got ${String(limit)}`);
    }
    const wait = seconds('wait', opts.wait ?? MAX_WAIT_SECONDS);
    const ttl = opts.ttl === undefined ? undefined : seconds('ttl', opts.ttl);
    const value = toValue('value', opts.value);
    checkSize(key, opts.holder ?? '', value);
    if (this.closed) throw new LocksideError('the client is closed', key);
    return this.reaching(key, opts.signal, () => this.take(key, wait, ttl, opts, limit, value));
  }

  /**
   * Takes every key of `keys` (2 to 64 distinct keys) at once for a new holder (or for
   * `opts.holder`), all or none: resolves with `Locks` (each key's `Lock`, in the
   * order asked) once every key is held, or rejects and holds none of them. Callers
   * asking for overlapping keys in any order never deadlock: a waiting request holds
   * nothing. Rejects as `lock()` does (the error's `key` names the keys asked for):
   * `NotAcquired` (busy, timed out, aborted), `Rejected` (no keys, one key, a key twice,
   * more than 64, a bad key), `Unavailable`.
   */
  async lockAll(keys: readonly string[], opts: LockAllOptions = {}): Promise<Locks> {
    const asked = checkKeys(keys);
    if (opts.holder !== undefined) checkText('holder', opts.holder);
    const wait = seconds('wait', opts.wait ?? MAX_WAIT_SECONDS);
    const ttl = opts.ttl === undefined ? undefined : seconds('ttl', opts.ttl);
    const named = keysNamed(asked);
    if (this.closed) throw new LocksideError('the client is closed', named);
    return this.reaching(named, opts.signal, () =>
      this.asking(
        named,
        opts.signal,
        (request) => this.native.acquireAll(request, asked, wait, ttl, Boolean(opts.shared), Boolean(opts.fair), opts.holder),
        (natives: NativeLock[]) => new Locks(natives.map((native) => this.held(new Lock(native)))),
        (locks) => void locks.release().catch(() => undefined), // granted as it was given up
      ),
    );
  }

  /** Runs `attempt` until it is not refused for want of a sidecar at `addr` (waiting
   * up to `waitForSidecar` seconds, with one console line), with its errors made the
   * package's (`key` names what was asked). */
  private async reaching<T>(key: string, signal: AbortSignal | undefined, attempt: () => Promise<T>): Promise<T> {
    const until = performance.now() + this.waitForSidecar * 1000;
    let waited = false;
    for (;;) {
      if (signal?.aborted) throw signal.reason;
      try {
        return await attempt();
      } catch (e) {
        const f = failure(e);
        if (f?.kind !== 'no_sidecar') throw fromNative(e, 'lock', key);
        if (performance.now() < until) {
          if (!waited) console.warn(`lockside: no sidecar at ${this.addr} yet (${f.reason}); waiting up to ${this.waitForSidecar} s for one`);
          waited = true;
          await sleep(100);
          continue;
        }
        const hint = this.waitForSidecar > 0 ? ` (waited ${this.waitForSidecar} s)` : '; to wait for one, pass { waitForSidecar: seconds }';
        const err = fromNative(e, 'lock', key);
        throw new Unavailable(`${err.message}${hint}`, 14, { cause: err.cause });
      }
    }
  }

  /** One acquire in the core, given up when `opts.signal` aborts. */
  private take(key: string, wait: number, ttl: number | undefined, opts: LockOptions, limit: number, value: Buffer): Promise<Lock> {
    return this.asking(
      key,
      opts.signal,
      (request) => this.native.acquire(request, key, wait, ttl, Boolean(opts.shared), limit, Boolean(opts.fair), value, opts.holder),
      (native: NativeLock) => this.held(new Lock(native)),
      (lock) => void lock.release().catch(() => undefined), // granted as it was given up
    );
  }

  /** A request to the core (`ask`, numbered for `giveUp`), given up when `signal`
   * aborts; what it resolves with made the package's by `made`, and let go by `drop`
   * if it comes after the abort. */
  private asking<N, T>(
    key: string,
    signal: AbortSignal | undefined,
    ask: (request: number) => Promise<N>,
    made: (native: N) => T,
    drop: (taken: T) => void,
  ): Promise<T> {
    const request = nextRequest++ >>> 0;
    const asked = ask(request);
    if (!signal) return asked.then(made);
    return new Promise((resolve, reject) => {
      let aborted = false;
      const onAbort = () => {
        aborted = true;
        this.native.giveUp(request);
        reject(signal.reason instanceof Error ? signal.reason : new LocksideError('aborted', key));
      };
      signal.addEventListener('abort', onAbort, { once: true });
      asked.then(
        (native) => {
          signal.removeEventListener('abort', onAbort);
          const taken = made(native);
          if (aborted) drop(taken);
          else resolve(taken);
        },
        (e) => {
          signal.removeEventListener('abort', onAbort);
          reject(e);
        },
      );
    });
  }

  private held(lock: Lock): Lock {
    this.locks.add(lock);
    const forget = () => this.locks.delete(lock);
    void lock.lost.then(forget);
    return lock;
  }

  /**
   * Campaigns for leadership of `key` with `value` (who you are, where to reach you);
   * resolves once this client leads, with the `Lock` that is leadership. Candidates
   * lead in the order they campaigned, across every sidecar of the store (a fair
   * EXCLUSIVE lock). Lead until `lock.lost` settles or you `release()` (resign).
   */
  async campaign(key: string, value: Uint8Array | string = '', opts: CampaignOptions = {}): Promise<Lock> {
    return this.lock(key, { ...opts, value, fair: true, shared: false, limit: 0 });
  }

  /**
   * Follows `key`: `for await (const state of client.watch(key))` gets its state now,
   * then one per change (a grant, a release, an expiry, a holder's value). A slow
   * reader gets the latest state, skipping those in between. Leaving the loop ends the
   * watch; errors are `Rejected` (a bad key, the watch limit) and `Unavailable`.
   */
  async *watch(key: string, { signal }: { signal?: AbortSignal } = {}): AsyncGenerator<Description, void, undefined> {
    if (this.closed) throw new LocksideError('the client is closed');
    checkText('key', key);
    const watch = this.native.watch(key);
    const onAbort = () => watch.cancel();
    signal?.addEventListener('abort', onAbort, { once: true });
    try {
      for (;;) {
        if (signal?.aborted) return;
        let state;
        try {
          state = await watch.next();
        } catch (e) {
          if (signal?.aborted) return; // ended by the caller
          throw fromNative(e, 'watch', key);
        }
        if (!state) return;
        yield toDescription(state);
      }
    } finally {
      // Leaving the loop (break, return, throw) ends the watch.
      signal?.removeEventListener('abort', onAbort);
      watch.cancel();
    }
  }

  /** Runs `fn(lock)` while holding `key` and releases afterwards, also when `fn` throws. */
  async withLock<T>(key: string, opts: LockOptions, fn: (lock: Lock) => Promise<T> | T): Promise<T> {
    const lock = await this.lock(key, opts);
    let result: T;
    try {
      result = await fn(lock);
    } catch (e) {
      await lock.release().catch(() => undefined); // `fn`'s error is the one to see
      throw e;
    }
    await lock.release();
    return result;
  }

  /** The store's view of `key` (after the releases of it this process made): holders,
   * waiters, fair queue, last fencing token. */
  async describe(key: string, { timeout = 5 }: { timeout?: number } = {}): Promise<Description> {
    checkText('key', key);
    if (this.closed) throw new LocksideError('the client is closed', key);
    try {
      return toDescription(await this.native.describe(key, seconds('timeout', timeout)));
    } catch (e) {
      throw fromNative(e, 'describe', key);
    }
  }

  /** Ends the session (the sidecar releases every lock it holds; they are marked lost:
   * 'client closed'). */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await this.native.close();
    for (const lock of this.locks) lock._closed();
    this.locks.clear();
  }
}

/** `value` seconds, checked: finite and not negative; `name` says which option. */
function seconds(name: string, value: number): number {
  if (typeof value !== 'number' || !Number.isFinite(value) || value < 0) {
    throw new RangeError(`${name} must be a finite number of seconds >= 0, got ${String(value)}`);
  }
  return value;
}
