// The client: a channel to the sidecar and the session on it, opened on the first
// `lock()`, opened again after one ends; `describe()` and `watch()` are plain calls.
import * as grpc from '@grpc/grpc-js';
import { openSession } from './connect.js';
import { type Description, toDescription } from './description.js';
import { LocksideError, callError } from './errors.js';
import { checkText } from './limits.js';
import type { Lock, LockOptions } from './lock.js';
import type { Session } from './session.js';
import { type LockServiceClient, lockService } from './wire.js';

/** Where clients find the sidecar unless told otherwise. */
export const DEFAULT_ADDR = '127.0.0.1:7420';

/**
 * HTTP/2 keepalive well below the lock TTL (README, "Client guidance"): a frozen or
 * unreachable sidecar is noticed within about 2 s (a ping a second, a second to answer
 * it), the stream fails, and every lock of the session is suspended before the store can
 * let it go (a lock renewed every TTL/3 lives at least TTL × 2/3 after its sidecar froze:
 * more than 2 s from a TTL of 4 s up). The sidecar is local: after a restart, reconnect
 * within a second rather than after gRPC's default backoff.
 */
const CHANNEL_OPTIONS: grpc.ChannelOptions = {
  'grpc.keepalive_time_ms': 1000,
  'grpc.keepalive_timeout_ms': 1000,
  'grpc.keepalive_permit_without_calls': 1,
  'grpc.initial_reconnect_backoff_ms': 100,
  'grpc.max_reconnect_backoff_ms': 1000,
};

/** How to campaign for leadership (`client.campaign()`). */
export interface CampaignOptions {
  /** Seconds to wait for leadership; undefined waits as long as the sidecar allows (24 h). */
  wait?: number;
  /** Seconds the store keeps leadership if the sidecar stops renewing it. */
  ttl?: number;
  /** Aborting it gives up the campaign. */
  signal?: AbortSignal;
}

/** How to reach the sidecar. */
export interface ClientOptions {
  /** Sent as `lockside-client-name`; shown by `describe()`. */
  clientName?: string;
  /** Sent as `authorization: Bearer <token>` (the sidecar's `--auth-token-file`). */
  authToken?: string;
  /** TLS: `grpc.credentials.createSsl(...)`; default plaintext (loopback, unix socket). */
  credentials?: grpc.ChannelCredentials;
  /** More gRPC channel options. */
  channelOptions?: grpc.ChannelOptions;
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
 * (also while the sidecar answers FAILED_PRECONDITION): each lock the resumed session
 * lists with its fencing token is restored (the same session id, tokens and hold
 * counts). A lock is lost when it comes back `Lost` or not at all, when resuming is
 * refused for good, or when its TTL has passed since the break (the store has let it
 * go); at once when the sidecar's store cannot resume sessions (no resume token: the
 * embedded memory store). Waits in progress when the stream breaks reject with
 * `Unavailable` (the sidecar does not resume them); `lock()` calls made while the
 * session resumes wait for it. A session that cannot be resumed, or ends otherwise,
 * loses every lock, and the next `lock()` opens a new session. `{ resume: false }`
 * turns resuming off: a break loses every lock at once.
 */
export class Client {
  /** The sidecar's address: `host:port` or `unix:/path`. */
  readonly addr: string;
  private readonly stub: LockServiceClient;
  private readonly metadata: grpc.Metadata;
  private readonly timing: { connectTimeout: number; waitForSidecar: number };
  private readonly sessionOptions: { resume: boolean };
  private session?: Session;
  private opening?: Promise<Session>;
  private closed = false;
  /** Names the holder of each `lock()` call: "1", "2", ... (short: the sidecar keeps
   * the name with the lock in the store). */
  private nextHolder = 1;

  /** `addr` defaults to $LOCKSIDE_ADDR, then 127.0.0.1:7420. */
  constructor(addr?: string, options: ClientOptions = {}) {
    this.addr = addr || process.env.LOCKSIDE_ADDR || DEFAULT_ADDR;
    const target = this.addr.replace(/^http:\/\//, '');
    const Service = lockService();
    this.stub = new Service(target, options.credentials ?? grpc.credentials.createInsecure(), {
      ...CHANNEL_OPTIONS,
      ...options.channelOptions,
    });
    this.metadata = new grpc.Metadata();
    if (options.clientName) this.metadata.set('lockside-client-name', options.clientName);
    if (options.authToken) this.metadata.set('authorization', `Bearer ${options.authToken}`);
    this.timing = { connectTimeout: options.connectTimeout ?? 10, waitForSidecar: options.waitForSidecar ?? 0 };
    for (const [name, value] of Object.entries(this.timing)) {
      if (typeof value !== 'number' || !(value >= 0)) {
        throw new RangeError(`${name} must be a number of seconds >= 0, got ${String(value)}`);
      }
    }
    this.sessionOptions = { resume: options.resume ?? true };
  }

  /** The current session's id (as `describe()` shows it); undefined before the first lock. */
  get sessionId(): string | undefined {
    return this.session && this.session.ended === undefined ? this.session.sessionId : undefined;
  }

  private async currentSession(): Promise<Session> {
    if (this.session && this.session.ended === undefined) return this.session;
    if (this.closed) throw new LocksideError('the client is closed');
    if (!this.opening) {
      this.opening = openSession(this.addr, this.stub, this.metadata, this.timing, this.sessionOptions).finally(() => {
        this.opening = undefined;
      });
    }
    let session: Session;
    try {
      session = await this.opening;
    } catch (e) {
      if (this.closed) throw new LocksideError('the client is closed');
      throw e;
    }
    if (this.closed) {
      await session.close();
      throw new LocksideError('the client is closed');
    }
    this.session = session;
    return session;
  }

  /**
   * Takes `key` for a new holder (or for `opts.holder`). Rejects with `NotAcquired`
   * (busy, timed out), `Rejected` (a bad value, a conflicting mode or limit, the store
   * unreachable), `Unavailable` (no sidecar), and `TypeError`/`RangeError` for values
   * that are not numbers of seconds.
   */
  async lock(key: string, opts: LockOptions = {}): Promise<Lock> {
    const holder = opts.holder ?? String(this.nextHolder++);
    const session = await this.currentSession();
    return session.acquire(key, holder, opts);
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
    const call = this.stub.Watch({ key }, this.metadata);
    const onAbort = () => call.cancel();
    signal?.addEventListener('abort', onAbort, { once: true });
    try {
      for await (const message of call) {
        if (message.state) yield toDescription(message.state);
      }
    } catch (e) {
      const err = e as grpc.ServiceError;
      if (err.code === grpc.status.CANCELLED && signal?.aborted) return; // ended by the caller
      throw callError('watch', key, err);
    } finally {
      // Leaving the loop (break, return, throw) ends the call.
      signal?.removeEventListener('abort', onAbort);
      call.cancel();
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

  /** The store's view of `key`: holders, waiters, fair queue, last fencing token. */
  describe(key: string, { timeout = 5 }: { timeout?: number } = {}): Promise<Description> {
    return new Promise((resolve, reject) => {
      checkText('key', key); // (a throw here rejects)
      this.stub.Describe({ key }, this.metadata, { deadline: Date.now() + timeout * 1000 }, (err, res) => {
        if (err || !res) {
          reject(callError('describe', key, err ?? undefined));
          return;
        }
        resolve(toDescription(res));
      });
    });
  }

  /** Ends the session (the sidecar releases every lock it holds; they are marked lost)
   * and closes the channel. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    const session = this.session;
    this.session = undefined;
    if (session) await session.close();
    this.stub.close();
  }
}
