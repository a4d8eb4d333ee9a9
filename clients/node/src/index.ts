/**
 * Lockside: distributed locks held by a live gRPC stream to the sidecar in your pod.
 *
 * ```ts
 * import { Client } from 'lockside';
 * const client = new Client();                       // $LOCKSIDE_ADDR or 127.0.0.1:7420
 * const lock = await client.lock('orders', { wait: 5, ttl: 10 });
 * try {
 *   await write(data, { fencingToken: lock.fencingToken, signal: lock.signal });
 * } finally {
 *   await lock.release();                            // rejects with LockLost if it was lost
 * }
 * client.close();
 * ```
 *
 * One client is one session (one `Lease` stream) holding any number of locks; the
 * sidecar releases them all when the stream ends, whatever ends it.
 *
 * Leader election: `await client.campaign(key, value)` resolves once this client leads
 * (a `Lock`: `proclaim(value)` changes what followers see, `release()` resigns);
 * followers read `for await (const state of client.watch(key))`, `state.leader` being
 * undefined while nobody leads.
 */
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import { descriptor } from './descriptor.generated.js';

/** Where clients find the sidecar unless told otherwise. */
export const DEFAULT_ADDR = '127.0.0.1:7420';
/** The longest wait the sidecar accepts; `wait` undefined asks for it. */
export const MAX_WAIT_SECONDS = 24 * 3600;
/** How long past its own wait an answer may take before the client gives up on it. */
const ANSWER_SLACK_SECONDS = 10;
/** The longest holder value the sidecar accepts (`Acquire.value`, `Proclaim.value`). */
export const MAX_VALUE_BYTES = 4096;

/**
 * HTTP/2 keepalive well below the lock TTL (README, "Client guidance"): a frozen or
 * unreachable sidecar is noticed in about 2 s, the stream fails, and every lock of the
 * session is lost before the store can let it go. The sidecar is local: after a restart,
 * reconnect within a second rather than after gRPC's default backoff.
 */
const CHANNEL_OPTIONS: grpc.ChannelOptions = {
  'grpc.keepalive_time_ms': 1000,
  'grpc.keepalive_timeout_ms': 1000,
  'grpc.keepalive_permit_without_calls': 1,
  'grpc.initial_reconnect_backoff_ms': 100,
  'grpc.max_reconnect_backoff_ms': 1000,
};

// -- errors -------------------------------------------------------------------

/** Base class of every error this package throws. */
export class LocksideError extends Error {
  /** The key the failed request was about, when there is one. */
  readonly key?: string;
  constructor(message: string, key?: string) {
    super(message);
    this.name = new.target.name;
    this.key = key;
  }
}

/** Why a lock was not acquired. */
export type NotAcquiredReason = 'BUSY' | 'TIMEOUT' | 'CANCELLED' | 'UNSPECIFIED';

/**
 * The lock was not acquired: `reason` is BUSY (held and `wait: 0`), TIMEOUT (still
 * held when `wait` ran out) or CANCELLED.
 */
export class NotAcquired extends LocksideError {
  readonly reason: NotAcquiredReason;
  constructor(key: string, reason: NotAcquiredReason) {
    super(`lock ${shortKey(key)} not acquired: ${reason}`, key);
    this.reason = reason;
  }
}

/**
 * The sidecar refused a request: a bad value (`code` 3 INVALID_ARGUMENT), a limit
 * reached (8 RESOURCE_EXHAUSTED), a conflicting mode or limit (9 FAILED_PRECONDITION),
 * or a store it cannot reach (14 UNAVAILABLE). The session and its other locks go on.
 */
export class Rejected extends LocksideError {
  /** A google.rpc.Code number. */
  readonly code: number;
  /** Its name, e.g. 'INVALID_ARGUMENT'. */
  readonly codeName: string;
  /** The sidecar's explanation. */
  readonly details: string;
  constructor(key: string, code: number, details: string) {
    const codeName = (grpc.status as unknown as Record<number, string>)[code] ?? 'UNKNOWN_CODE';
    super(`request for ${shortKey(key)} rejected: ${codeName} (${code}): ${details}`, key);
    this.code = code;
    this.codeName = codeName;
    this.details = details;
  }
}

/**
 * The lock was lost while held (the sidecar sent `Lost`, or the session's stream
 * broke). `release()` rejects with it when the lock was lost before.
 */
export class LockLost extends LocksideError {
  readonly reason: string;
  readonly fencingToken: bigint;
  constructor(key: string, reason: string, fencingToken: bigint) {
    super(`lock ${shortKey(key)} lost: ${reason}`, key);
    this.reason = reason;
    this.fencingToken = fencingToken;
  }
}

/** The sidecar could not be reached, or the session's stream broke before it answered. */
export class Unavailable extends LocksideError {
  /** The gRPC status code of the stream or call, when there was one. */
  readonly code?: number;
  constructor(message: string, code?: number) {
    super(message);
    this.code = code;
  }
}

function shortKey(key: string): string {
  return key.length <= 80 ? JSON.stringify(key) : `${JSON.stringify(key.slice(0, 60))}... (${key.length} characters)`;
}

// -- wire types (as @grpc/proto-loader decodes them: longs as strings) -----------

interface Duration {
  seconds: string;
  nanos: number;
}
interface GrantedMsg {
  requestId: string;
  key: string;
  fencingToken: string;
  ttl: Duration | null;
  holdCount: number;
}
interface AnswerMsg {
  requestId: string;
  key: string;
  value?: Buffer;
  reason?: string;
  code?: number;
  message?: string;
  holdCount?: number;
}
interface LeaseResponse {
  event?: string;
  started?: { sessionId: string; defaultTtl: Duration | null };
  granted?: GrantedMsg;
  waiting?: AnswerMsg & { position: number };
  notAcquired?: AnswerMsg;
  released?: AnswerMsg;
  rejected?: AnswerMsg;
  proclaimed?: AnswerMsg;
  lost?: { key: string; reason: string; fencingToken: string };
  jeopardy?: { key: string; ttlRemaining: Duration | null };
  restored?: { key: string; ttl: Duration | null };
}
interface DescribeResponseMsg {
  key: string;
  mode: string;
  limit: number;
  holders: {
    sessionId: string;
    holdCount: number;
    ttlRemaining: Duration | null;
    clientName: string;
    value: Buffer;
    fencingToken: string;
  }[];
  waiters: number;
  fencingToken: string;
  queue: { sessionId: string; clientName: string; mode: string; position: number }[];
}

function seconds(d: Duration | null | undefined): number {
  return d ? Number(d.seconds) + d.nanos / 1e9 : 0;
}

function duration(name: string, value: number): { seconds: number; nanos: number } {
  if (typeof value !== 'number' || !Number.isFinite(value) || value < 0) {
    throw new RangeError(`${name} must be a finite number of seconds >= 0, got ${String(value)}`);
  }
  const whole = Math.trunc(value);
  return { seconds: whole, nanos: Math.round((value - whole) * 1e9) };
}

type LeaseCall = grpc.ClientDuplexStream<Record<string, unknown>, LeaseResponse>;
type WatchCall = grpc.ClientReadableStream<{ state: DescribeResponseMsg | null }>;
interface LockServiceClient extends grpc.Client {
  Lease(metadata: grpc.Metadata, options?: grpc.CallOptions): LeaseCall;
  Watch(request: { key: string }, metadata: grpc.Metadata, options?: grpc.CallOptions): WatchCall;
  Describe(
    request: { key: string },
    metadata: grpc.Metadata,
    options: grpc.CallOptions,
    callback: (err: grpc.ServiceError | null, res?: DescribeResponseMsg) => void,
  ): grpc.ClientUnaryCall;
}
type LockServiceCtor = new (
  address: string,
  credentials: grpc.ChannelCredentials,
  options?: grpc.ChannelOptions,
) => LockServiceClient;

let serviceCtor: LockServiceCtor | undefined;
function lockService(): LockServiceCtor {
  if (!serviceCtor) {
    const definition = protoLoader.fromJSON(descriptor, {
      longs: String, // uint64 fencing tokens and request ids as decimal strings
      enums: String,
      defaults: true,
      oneofs: true, // `event` names the field that is set
    });
    const pkg = grpc.loadPackageDefinition(definition) as unknown as {
      lockside: { v1: { LockService: LockServiceCtor } };
    };
    serviceCtor = pkg.lockside.v1.LockService;
  }
  return serviceCtor;
}

// -- public types --------------------------------------------------------------

/** How to take a lock. */
export interface LockOptions {
  /** Seconds to wait while the key is busy; 0 fails at once; undefined waits as long as
   * the sidecar allows (24 h). */
  wait?: number;
  /** Seconds the store keeps the lock if the sidecar stops renewing it (1 s to the
   * sidecar's maximum); undefined: the sidecar's default (10 s). */
  ttl?: number;
  /** A reader lock: shared holders coexist and exclude exclusive ones. */
  shared?: boolean;
  /** N > 1 makes the key a semaphore of N permits (not with `shared`). */
  limit?: number;
  /** Wait in arrival order. */
  fair?: boolean;
  /** The holder's value, shown by `describe()` and `watch()` (a string is sent as
   * UTF-8; at most 4 KiB). On a key the session already holds, a non-empty value
   * replaces its value (as `proclaim`). */
  value?: Uint8Array | string;
  /** Aborting it gives up a pending acquire (the wait is cancelled on the sidecar). */
  signal?: AbortSignal;
}

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
  /** Seconds to wait for the sidecar when a session opens (default 10). */
  connectTimeout?: number;
}

/** What `lock.lost` resolves with. */
export interface LostInfo {
  key: string;
  reason: string;
  fencingToken: bigint;
}

/** One session holding a key. */
export interface Holder {
  sessionId: string;
  holdCount: number;
  /** Seconds before the store lets the lock go if it is not renewed. */
  ttlRemaining: number;
  clientName: string;
  /** The holder's value (in an election: who leads, and where); empty for none. */
  value: Buffer;
  /** The fencing token of the holder's grant: successive leaders have larger ones. */
  fencingToken: bigint;
}

/** The store's view of one key. */
export interface Description {
  key: string;
  /** 'EXCLUSIVE', 'SHARED', or 'UNSPECIFIED' when nobody holds it. */
  mode: string;
  /** 1 for a lock, N for a semaphore of N permits, 0 when nobody holds the key. */
  limit: number;
  holders: Holder[];
  waiters: number;
  /** The last fencing token issued for the key (0n if none ever was). */
  fencingToken: bigint;
  queue: { sessionId: string; clientName: string; mode: string; position: number }[];
  /** The holder of an election key, undefined when nobody leads (for a key held by
   * several, the oldest grant). */
  leader?: Holder;
}

function toValue(name: string, value: Uint8Array | string | undefined): Buffer {
  if (value === undefined) return Buffer.alloc(0);
  if (typeof value === 'string') return Buffer.from(value, 'utf8');
  if (value instanceof Uint8Array) return Buffer.from(value);
  throw new TypeError(`${name} must be a Uint8Array or a string, not ${typeof value}`);
}

function toDescription(res: DescribeResponseMsg): Description {
  const holders = res.holders.map((h) => ({
    sessionId: h.sessionId,
    holdCount: h.holdCount,
    ttlRemaining: seconds(h.ttlRemaining),
    clientName: h.clientName,
    value: Buffer.from(h.value ?? []),
    fencingToken: BigInt(h.fencingToken),
  }));
  let leader: Holder | undefined;
  for (const h of holders) if (!leader || h.fencingToken < leader.fencingToken) leader = h;
  return {
    key: res.key,
    mode: res.mode.replace(/^LOCK_MODE_/, ''),
    limit: res.limit,
    holders,
    waiters: res.waiters,
    fencingToken: BigInt(res.fencingToken),
    queue: res.queue.map((q) => ({ ...q, mode: q.mode.replace(/^LOCK_MODE_/, '') })),
    leader,
  };
}

/** A failed unary or server-streaming call as this package's error. */
function callError(what: string, key: string, err: grpc.ServiceError | undefined): LocksideError {
  const code = err?.code;
  if (code === undefined || [grpc.status.UNAVAILABLE, grpc.status.DEADLINE_EXCEEDED, grpc.status.CANCELLED].includes(code)) {
    return new Unavailable(`${what} ${shortKey(key)}: ${err?.details ?? 'no answer'}`, code);
  }
  return new Rejected(key, code, err!.details);
}

// -- one lock ---------------------------------------------------------------------

/** A held lock, from `client.lock()`. */
export class Lock {
  /** The lock's name. */
  readonly key: string;
  /** Pass it to the resource you protect; it must reject writes with lower tokens. */
  readonly fencingToken: bigint;
  /** Seconds of validity the sidecar reported with the grant (it renews the lock for as
   * long as the session lives). */
  readonly ttl: number;
  /** How many times the session held the key after this grant (reentrancy). */
  readonly holdCount: number;
  /** The session shown by `describe()`. */
  readonly sessionId: string;
  /** Resolves when the lock is lost (the sidecar sent `Lost`, or the session's stream
   * broke): stop using the resource then. Never rejects; never settles after a clean
   * release. */
  readonly lost: Promise<LostInfo>;
  /** Aborted when the lock is lost: hand it to work that must stop at once. */
  readonly signal: AbortSignal;
  /** Why the lock was lost, once it is. */
  lostReason?: string;

  /** @internal */ _state: 'held' | 'lost' | 'released' = 'held';
  private readonly session: Session;
  private readonly onLost: (info: LostInfo) => void;

  /** @internal */
  constructor(session: Session, key: string, granted: GrantedMsg) {
    this.session = session;
    this.key = key;
    this.fencingToken = BigInt(granted.fencingToken);
    this.ttl = seconds(granted.ttl);
    this.holdCount = granted.holdCount;
    this.sessionId = session.sessionId;
    const controller = new AbortController();
    this.signal = controller.signal;
    let resolve!: (info: LostInfo) => void;
    this.lost = new Promise<LostInfo>((r) => (resolve = r));
    this.onLost = (info) => {
      resolve(info);
      controller.abort(new LockLost(info.key, info.reason, info.fencingToken));
    };
  }

  /** True until the lock is released or lost. */
  get held(): boolean {
    return this._state === 'held';
  }

  /** @internal */
  _markLost(reason: string): void {
    if (this._state !== 'held') return;
    this._state = 'lost';
    this.lostReason = reason;
    this.onLost({ key: this.key, reason, fencingToken: this.fencingToken });
  }

  /**
   * Gives the lock back and waits for the sidecar to confirm. Resolves at once if
   * already released; rejects with `LockLost` (once) if the lock was lost before.
   */
  release(): Promise<void> {
    return this.session.release(this);
  }

  /**
   * Replaces the lock's value (what `describe()` and `watch()` show of this holder): a
   * leader telling its followers where it now is, without giving up leadership. At
   * most 4 KiB. Rejects with `LockLost` if the lock is no longer held, `Rejected` for
   * a value too large or a store the sidecar cannot reach.
   */
  proclaim(value: Uint8Array | string): Promise<void> {
    return this.session.proclaim(this, value);
  }
}

// -- one session ------------------------------------------------------------------

interface Pending {
  kind: 'acquire' | 'release' | 'proclaim';
  key: string;
  abandoned: boolean;
  /** The held lock of a Granted answer, made and put in `held` by the stream's data
   * handler, so a `Lost` in the same chunk of data finds it. */
  lock?: Lock;
  response?: LeaseResponse;
  settle: (response: LeaseResponse | null, error: Error | null) => void;
}

/**
 * One `Lease` stream. Answers are matched by `request_id`; `Lost` is routed by key to
 * every lock of this session on it (reentrant grants share a key). When the stream
 * ends, every pending request fails and every held lock is lost; the client opens a
 * new session for the next request. A later resume (DESIGN.md, "Sessions that survive
 * a sidecar restart") fits here: keep `SessionStarted.resume_token`, match grants with
 * request id 0 to `held` by key.
 * @internal
 */
class Session {
  sessionId = '';
  ended?: string;
  private nextId = 1;
  private readonly pending = new Map<string, Pending>();
  private readonly held = new Map<string, Lock[]>();
  private closing = false;
  private readonly done: Promise<void>;
  private markDone!: () => void;

  private constructor(private readonly call: LeaseCall) {
    this.done = new Promise((r) => (this.markDone = r));
  }

  static open(client: Client, stub: LockServiceClient, metadata: grpc.Metadata, timeoutS: number): Promise<Session> {
    return new Promise((resolve, reject) => {
      const deadline = Date.now() + timeoutS * 1000;
      stub.waitForReady(deadline, (err) => {
        if (err) {
          reject(new Unavailable(`no sidecar at ${client.addr} within ${timeoutS} s: ${err.message}`));
          return;
        }
        const session = new Session(stub.Lease(metadata));
        const timer = setTimeout(() => {
          session.call.cancel();
          reject(new Unavailable(`no answer from the sidecar at ${client.addr} within ${timeoutS} s`));
        }, Math.max(0, deadline - Date.now()));
        session.start((err) => {
          clearTimeout(timer);
          if (err) reject(err);
          else resolve(session);
        });
      });
    });
  }

  private start(opened: (err: Error | null) => void): void {
    let first = true;
    this.call.on('data', (resp: LeaseResponse) => {
      if (first) {
        first = false;
        if (resp.event !== 'started' || !resp.started) {
          this.call.cancel();
          opened(new Unavailable(`protocol error: the stream opened with ${resp.event}, not SessionStarted`));
          return;
        }
        this.sessionId = resp.started.sessionId;
        opened(null);
        return;
      }
      this.dispatch(resp);
    });
    this.call.on('error', (err: grpc.ServiceError) => {
      const details = String(err.details || err.message).replace(/\s*Resolution note:.*$/s, '');
      const reason = this.closing ? 'client closed' : `${grpc.status[err.code] ?? err.code}: ${details}`;
      if (first) {
        first = false;
        opened(new Unavailable(`cannot open a session: ${reason}`, err.code));
      }
      this.end(reason, err.code);
    });
    this.call.on('end', () => {
      if (first) {
        first = false;
        opened(new Unavailable('cannot open a session: the stream ended'));
      }
      this.end(this.closing ? 'client closed' : 'closed by the sidecar');
    });
    // 'error' may come without 'end'; 'status' always comes last.
    this.call.on('status', () => this.end(this.closing ? 'client closed' : 'closed by the sidecar'));
  }

  private dispatch(resp: LeaseResponse): void {
    switch (resp.event) {
      case 'lost': {
        const lost = resp.lost!;
        const locks = this.held.get(lost.key) ?? [];
        this.held.delete(lost.key);
        for (const lock of locks) lock._markLost(lost.reason || 'Lost');
        return;
      }
      case 'jeopardy':
      case 'restored':
      case 'waiting':
        return; // informational: only `Lost` means stop
      case 'granted':
      case 'notAcquired':
      case 'rejected':
      case 'released':
      case 'proclaimed':
        break;
      default:
        return;
    }
    const answer = resp[resp.event] as AnswerMsg;
    const pending = this.pending.get(answer.requestId);
    if (!pending) return; // the answer to an abandoned cancel-Release
    this.pending.delete(answer.requestId);
    if (resp.event === 'granted') {
      if (pending.abandoned) {
        this.sendRelease(pending.key); // nobody waits for this grant any more
        return;
      }
      const lock = new Lock(this, pending.key, resp.granted!);
      const locks = this.held.get(pending.key);
      if (locks) locks.push(lock);
      else this.held.set(pending.key, [lock]);
      pending.lock = lock;
    }
    pending.settle(resp, null);
  }

  private sendRelease(key: string): string {
    const requestId = String(this.nextId++);
    this.call.write({ release: { requestId, key } });
    return requestId;
  }

  /** The caller gave up on `rid` (timeout, abort). See the Python client's notes. */
  private abandon(rid: string, pending: Pending): void {
    if (this.pending.get(rid) !== pending) return;
    pending.abandoned = true;
    if (pending.kind === 'acquire' && !this.held.get(pending.key)?.length && this.ended === undefined) {
      // A Release of a key only waited for cancels the wait.
      this.pending.delete(rid);
      this.sendRelease(pending.key);
    }
  }

  private end(reason: string, code?: number): void {
    if (this.ended !== undefined) return;
    this.ended = reason;
    for (const pending of this.pending.values()) {
      pending.settle(null, new Unavailable(`lease stream ended: ${reason}`, code));
    }
    this.pending.clear();
    for (const locks of this.held.values()) for (const lock of locks) lock._markLost(reason);
    this.held.clear();
    this.markDone();
  }

  private request(
    kind: Pending['kind'],
    key: string,
    message: Record<string, unknown>,
    rid: string,
    timeoutS: number,
    signal?: AbortSignal,
  ): Promise<Pending> {
    return new Promise((resolve, reject) => {
      let onAbort: (() => void) | undefined;
      const timer = setTimeout(() => {
        this.abandon(rid, pending);
        settle(null, new Unavailable(`no answer from the sidecar within ${timeoutS} s`));
      }, timeoutS * 1000);
      const settle = (response: LeaseResponse | null, error: Error | null) => {
        clearTimeout(timer);
        if (onAbort) signal!.removeEventListener('abort', onAbort);
        if (error) reject(error);
        else {
          pending.response = response!;
          resolve(pending);
        }
      };
      const pending: Pending = { kind, key, abandoned: false, settle };
      if (signal) {
        onAbort = () => {
          this.abandon(rid, pending);
          settle(null, signal.reason instanceof Error ? signal.reason : new LocksideError('aborted', key));
        };
        signal.addEventListener('abort', onAbort, { once: true });
      }
      this.pending.set(rid, pending);
      this.call.write(message);
    });
  }

  async acquire(key: string, opts: LockOptions): Promise<Lock> {
    if (typeof key !== 'string') throw new TypeError(`key must be a string, not ${typeof key}`);
    const limit = opts.limit ?? 0;
    if (!Number.isInteger(limit) || limit < 0 || limit > 0xffffffff) {
      throw new RangeError(`limit must be an integer between 0 and 2**32-1, got ${String(limit)}`);
    }
    const wait = opts.wait ?? MAX_WAIT_SECONDS;
    const acquire: Record<string, unknown> = {
      key,
      mode: opts.shared ? 'LOCK_MODE_SHARED' : 'LOCK_MODE_EXCLUSIVE',
      limit,
      fair: Boolean(opts.fair),
      value: toValue('value', opts.value),
    };
    const waitTimeout = duration('wait', wait);
    if (wait > 0) acquire.waitTimeout = waitTimeout;
    if (opts.ttl !== undefined) acquire.ttl = duration('ttl', opts.ttl);
    if (opts.signal?.aborted) throw opts.signal.reason;
    if (this.ended !== undefined) throw new Unavailable(`lease stream ended: ${this.ended}`);
    const rid = String(this.nextId++);
    acquire.requestId = rid;
    const pending = await this.request('acquire', key, { acquire }, rid, wait + ANSWER_SLACK_SECONDS, opts.signal);
    const resp = pending.response!;
    if (pending.lock) return pending.lock;
    if (resp.event === 'notAcquired') {
      const reason = String(resp.notAcquired!.reason).replace(/^REASON_/, '') as NotAcquiredReason;
      throw new NotAcquired(key, reason);
    }
    const r = resp.rejected!;
    throw new Rejected(key, r.code ?? 0, r.message ?? '');
  }

  async release(lock: Lock): Promise<void> {
    if (lock._state === 'released') return;
    if (lock._state === 'lost') {
      lock._state = 'released'; // LockLost is reported once
      throw new LockLost(lock.key, lock.lostReason ?? 'lost', lock.fencingToken);
    }
    const rid = String(this.nextId++);
    let resp: LeaseResponse | null = null;
    let error: Error | null = null;
    try {
      resp = (await this.request('release', lock.key, { release: { requestId: rid, key: lock.key } }, rid, ANSWER_SLACK_SECONDS))
        .response!;
    } catch (e) {
      error = e as Error;
    }
    if (resp?.event === 'released') {
      lock._state = 'released';
      this.forget(lock);
      return;
    }
    // (The await above may have changed the state: a `Lost` can cross the Release.)
    if ((lock._state as Lock['_state']) === 'lost' || error instanceof Unavailable) {
      // Lost before the release, or the stream broke: the sidecar may have died with
      // the lock in the store, so it counts as lost.
      if (lock.lostReason === undefined) lock.lostReason = error?.message ?? 'lost';
      lock._state = 'released';
      this.forget(lock);
      throw new LockLost(lock.key, lock.lostReason, lock.fencingToken);
    }
    if (error) throw error;
    const r = resp!.rejected!;
    throw new Rejected(lock.key, r.code ?? 0, r.message ?? '');
  }

  async proclaim(lock: Lock, value: Uint8Array | string): Promise<void> {
    const bytes = toValue('value', value);
    if (lock._state === 'lost') throw new LockLost(lock.key, lock.lostReason ?? 'lost', lock.fencingToken);
    if (lock._state === 'released') throw new LocksideError(`lock ${shortKey(lock.key)} was released`, lock.key);
    if (this.ended !== undefined) throw new Unavailable(`lease stream ended: ${this.ended}`);
    const rid = String(this.nextId++);
    const message = { proclaim: { requestId: rid, key: lock.key, value: bytes } };
    const resp = (await this.request('proclaim', lock.key, message, rid, ANSWER_SLACK_SECONDS)).response!;
    if (resp.event === 'proclaimed') return;
    // (The await above may have changed the state: the sidecar sends `Lost` first.)
    if ((lock._state as Lock['_state']) === 'lost') {
      throw new LockLost(lock.key, lock.lostReason ?? 'lost', lock.fencingToken);
    }
    const r = resp.rejected!;
    throw new Rejected(lock.key, r.code ?? 0, r.message ?? '');
  }

  private forget(lock: Lock): void {
    const locks = this.held.get(lock.key);
    if (!locks) return;
    const i = locks.indexOf(lock);
    if (i >= 0) locks.splice(i, 1);
    if (locks.length === 0) this.held.delete(lock.key);
  }

  /** Half-closes the stream (the sidecar releases everything and ends it), waits up to
   * `timeoutMs` for that, then cancels. */
  async close(timeoutMs = 2000): Promise<void> {
    this.closing = true;
    if (this.ended === undefined) this.call.end();
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([this.done, new Promise<void>((r) => (timer = setTimeout(r, timeoutMs)))]);
    clearTimeout(timer);
    if (this.ended === undefined) {
      this.call.cancel();
      this.end('client closed');
    }
  }
}

// -- the client ----------------------------------------------------------------------

/**
 * A connection to a Lockside sidecar and one session on it. All locks taken through
 * one client share one `Lease` stream, opened on the first `lock()`; they belong to the
 * session, so locking a key the client already holds is reentrant. If the stream
 * breaks, every lock is lost and the next `lock()` opens a new session.
 */
export class Client {
  /** The sidecar's address: `host:port` or `unix:/path`. */
  readonly addr: string;
  private readonly stub: LockServiceClient;
  private readonly metadata: grpc.Metadata;
  private readonly connectTimeout: number;
  private session?: Session;
  private opening?: Promise<Session>;
  private closed = false;

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
    this.connectTimeout = options.connectTimeout ?? 10;
  }

  /** The current session's id (as `describe()` shows it); undefined before the first lock. */
  get sessionId(): string | undefined {
    return this.session && this.session.ended === undefined ? this.session.sessionId : undefined;
  }

  private async currentSession(): Promise<Session> {
    if (this.session && this.session.ended === undefined) return this.session;
    if (this.closed) throw new LocksideError('the client is closed');
    if (!this.opening) {
      this.opening = Session.open(this, this.stub, this.metadata, this.connectTimeout).finally(() => {
        this.opening = undefined;
      });
    }
    const session = await this.opening;
    if (this.closed) {
      await session.close();
      throw new LocksideError('the client is closed');
    }
    this.session = session;
    return session;
  }

  /**
   * Takes `key`. Rejects with `NotAcquired` (busy, timed out), `Rejected` (a bad value,
   * a conflicting mode or limit, the store unreachable), `Unavailable` (no sidecar), and
   * `TypeError`/`RangeError` for values that are not numbers of seconds.
   */
  async lock(key: string, opts: LockOptions = {}): Promise<Lock> {
    const session = await this.currentSession();
    return session.acquire(key, opts);
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
