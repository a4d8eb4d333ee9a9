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
 * sidecar releases them all when the stream ends, whatever ends it. When the stream
 * breaks, every lock is *suspended* at once (`lock.suspended`, a `'suspended'` event,
 * `lock.signal` aborted): stop using it. The client resumes the session, and each lock
 * is *restored* (`'restored'`) if the resumed session lists it, *lost* (`'lost'`,
 * `lock.lost`) otherwise (`{ resume: false }`: lost at once).
 *
 * Leader election: `await client.campaign(key, value)` resolves once this client leads
 * (a `Lock`: `proclaim(value)` changes what followers see, `release()` resigns);
 * followers read `for await (const state of client.watch(key))`, `state.leader` being
 * undefined while nobody leads.
 */
import { EventEmitter } from 'node:events';
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import { descriptor } from './gen/descriptor.js';
import type { ProtoGrpcType } from './gen/lockside.js';
import type { Duration__Output } from './gen/google/protobuf/Duration.js';
import type { Acquire } from './gen/lockside/v1/Acquire.js';
import type { DescribeResponse__Output } from './gen/lockside/v1/DescribeResponse.js';
import type { Granted__Output } from './gen/lockside/v1/Granted.js';
import type { LeaseRequest } from './gen/lockside/v1/LeaseRequest.js';
import type { LeaseResponse__Output } from './gen/lockside/v1/LeaseResponse.js';
import type { LockServiceClient } from './gen/lockside/v1/LockService.js';
import type { NotAcquired__Output } from './gen/lockside/v1/NotAcquired.js';
import type { Proclaimed__Output } from './gen/lockside/v1/Proclaimed.js';
import type { Rejected__Output } from './gen/lockside/v1/Rejected.js';
import type { Released__Output } from './gen/lockside/v1/Released.js';

/** Where clients find the sidecar unless told otherwise. */
export const DEFAULT_ADDR = '127.0.0.1:7420';
/** The longest wait the sidecar accepts; `wait` undefined asks for it. */
export const MAX_WAIT_SECONDS = 24 * 3600;
/** How long past its own wait an answer may take before the client gives up on it. */
const ANSWER_SLACK_SECONDS = 10;
/** The longest holder value the sidecar accepts (`Acquire.value`, `Proclaim.value`). */
export const MAX_VALUE_BYTES = 4096;
/**
 * The largest request the sidecar reads at all (its transport's limit, 4 MiB), less room
 * for the fields around the strings. Up to that size a bad request is answered
 * `Rejected` and the session goes on; above it gRPC ends the whole stream, and with it
 * every lock of the session, so the client refuses such a request before sending it.
 */
const MAX_SENDABLE_BYTES = 4 * 1024 * 1024 - 1024;

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
 * The lock was lost while held (the sidecar sent `Lost`, or the session's stream broke
 * and the lock did not come back). `release()` rejects with it when the lock was lost
 * before; it is `lock.signal`'s reason once the lock is lost.
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

/**
 * The lock is suspended: the session's stream broke, and a live sidecar may already have
 * released the lock and granted it elsewhere. It is `lock.signal`'s reason from that
 * moment: stop using the resource until `'restored'` (`lock.signal` is then a new signal,
 * not aborted) or `'lost'`.
 */
export class LockSuspended extends LocksideError {
  readonly reason: string;
  readonly fencingToken: bigint;
  constructor(key: string, reason: string, fencingToken: bigint) {
    super(`lock ${shortKey(key)} suspended: ${reason}`, key);
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

/** What the sidecar accepts of each name, for error messages (it checks the rest). */
const RULES = {
  key: 'a key is 1 to 512 bytes of UTF-8 without control characters',
  holder: 'a holder is at most 128 bytes of UTF-8 without control characters',
};

/**
 * Refuses, before anything is sent, a key or holder that cannot be encoded as UTF-8: a
 * JavaScript string with a lone surrogate (half of a UTF-16 pair). Protobuf would send
 * bytes that are not UTF-8, the sidecar could not decode the message, and gRPC would end
 * the whole stream, losing every lock of the session. Python refuses the same strings
 * (UnicodeEncodeError). Length and control characters are the sidecar's to judge: it
 * answers `Rejected` INVALID_ARGUMENT and the session goes on.
 */
function checkText(name: keyof typeof RULES, text: unknown): string {
  if (typeof text !== 'string') throw new TypeError(`${name} must be a string, not ${typeof text}`);
  const lone = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/.exec(text);
  if (lone) {
    const unit = `\\u${lone[0].charCodeAt(0).toString(16)}`;
    throw new RangeError(
      `${name} ${shortKey(text)} cannot be encoded as UTF-8: character '${unit}' at index ${lone.index} ` +
        `is a lone surrogate (${RULES[name]})`,
    );
  }
  return text;
}

/** Refuses a request too large for the sidecar to read (see `MAX_SENDABLE_BYTES`). */
function checkSize(key: string, holder: string, value: Buffer): void {
  const bytes = Buffer.byteLength(key) + Buffer.byteLength(holder) + value.length;
  if (bytes > MAX_SENDABLE_BYTES) {
    throw new RangeError(
      `request for ${shortKey(key)} is ${bytes} bytes: more than the 4 MiB the sidecar reads, which would ` +
        `end the session (${RULES.key}, ${RULES.holder}, a value at most ${MAX_VALUE_BYTES} bytes)`,
    );
  }
}

// -- wire types: generated into src/gen/ by scripts/build.mjs ------------------------
// (`__Output`: as @grpc/proto-loader decodes a message with the options below; the
// plain name: what grpc-js accepts to encode.)

type Duration = Duration__Output;
type GrantedMsg = Granted__Output;
type LeaseResponse = LeaseResponse__Output;
type DescribeResponseMsg = DescribeResponse__Output;
/** A final answer to a request, matched to it by `requestId`. */
type AnswerMsg = Granted__Output | NotAcquired__Output | Released__Output | Rejected__Output | Proclaimed__Output;

/** The longest delay a Node timer takes: a longer one fires at once, with a
 * TimeoutOverflowWarning. */
const MAX_TIMER_MS = 2 ** 31 - 1;

/** Calls `fn` after `ms`, also beyond what one Node timer takes (longer delays are
 * waited out in steps); `cancel()` stops it. */
function later(ms: number, fn: () => void): { cancel(): void } {
  const until = performance.now() + ms;
  let timer: NodeJS.Timeout;
  const arm = () => {
    const left = Math.max(0, until - performance.now());
    timer = left > MAX_TIMER_MS ? setTimeout(arm, MAX_TIMER_MS) : setTimeout(fn, left);
  };
  arm();
  return { cancel: () => clearTimeout(timer) };
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

type LeaseCall = grpc.ClientDuplexStream<LeaseRequest, LeaseResponse>;
type LockServiceCtor = ProtoGrpcType['lockside']['v1']['LockService'];

let serviceCtor: LockServiceCtor | undefined;
/** The generated client's constructor. The options are those scripts/build.mjs
 * generates the wire types with: the types say what this decodes. */
function lockService(): LockServiceCtor {
  if (!serviceCtor) {
    const definition = protoLoader.fromJSON(descriptor, {
      longs: String, // uint64 fencing tokens and request ids as decimal strings
      enums: String,
      defaults: true,
      oneofs: true, // `event` names the field that is set
    });
    const pkg = grpc.loadPackageDefinition(definition) as unknown as ProtoGrpcType;
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
  /** Who in the session asks (at most 128 bytes of UTF-8 without control characters).
   * Undefined: a holder of its own for this call (`'1'`, `'2'`, ... per client), so a
   * second `lock()` of a held key waits like anyone else. Pass `lock.holder` of a lock
   * this caller holds to take the key again reentrantly (`holdCount` 2, the same
   * fencing token). Names of your own should not be plain numbers: those are the
   * client's. */
  holder?: string;
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

/** What `lock.lost` resolves with, and the `'lost'` event carries. */
export interface LostInfo {
  key: string;
  reason: string;
  fencingToken: bigint;
}

/** What the `'suspended'` event carries: `reason` says how the stream broke. */
export interface SuspendedInfo {
  key: string;
  reason: string;
  fencingToken: bigint;
}

/** What the `'restored'` event carries: the same fencing token, in the same session. */
export interface RestoredInfo {
  key: string;
  fencingToken: bigint;
  sessionId: string;
}

/** The events of a `Lock`, with their arguments. */
export type LockEvents = {
  /** The session's stream broke: stop using the lock now (`lock.suspended`). */
  suspended: [SuspendedInfo];
  /** The resumed session lists the lock: nobody else held it in between; use it again. */
  restored: [RestoredInfo];
  /** The lock is gone: never use it again (`lock.lost` resolves too). */
  lost: [LostInfo];
};

/** One holder of a key: a session, or one holder inside a session. */
export interface Holder {
  sessionId: string;
  /** The holder inside its session (`lock.holder`); '' for the session itself. */
  holder: string;
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
  /** The fair waiters, next in line first (`holder`: the waiter inside its session). */
  queue: { sessionId: string; holder: string; clientName: string; mode: string; position: number }[];
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
    holder: h.holder ?? '',
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
    queue: res.queue.map((q) => ({ ...q, holder: q.holder ?? '', mode: q.mode.replace(/^LOCK_MODE_/, '') })),
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

/**
 * A held lock, from `client.lock()`. Use it while `held` is true: from the moment the
 * session's stream breaks it is *suspended* (`held` false, `suspended` true, `signal`
 * aborted, a `'suspended'` event), because a live sidecar releases a broken stream's
 * locks at once and a waiter elsewhere may hold it within milliseconds. It is then
 * either *restored* (`'restored'`: the resumed session listed it with the same fencing
 * token, nobody else held it in between) or *lost* (`'lost'`, `lost` resolves).
 */
export class Lock extends EventEmitter<LockEvents> {
  /** The lock's name. */
  readonly key: string;
  /** Pass it to the resource you protect; it must reject writes with lower tokens. */
  readonly fencingToken: bigint;
  /** Seconds of validity the sidecar reported with the grant (it renews the lock for as
   * long as the session lives). */
  readonly ttl: number;
  /** How many times this lock's holder held the key after this grant (reentrancy). */
  readonly holdCount: number;
  /** The session shown by `describe()`. */
  readonly sessionId: string;
  /** The holder inside the session (`describe()` shows it): each `lock()` call is one
   * of its own unless it passed `holder`. */
  readonly holder: string;
  /** Resolves when the lock is lost (the sidecar sent `Lost`, or the session's stream
   * broke and the lock did not come back): never use the resource again. Never
   * rejects; never settles after a clean release. */
  readonly lost: Promise<LostInfo>;
  /** Why the lock was lost, once it is. */
  lostReason?: string;

  /** @internal */ _state: 'held' | 'suspended' | 'lost' | 'released' = 'held';
  /** @internal The TTL (s) the store keeps the lock for without renewals (asked, else
   * the sidecar's default): once it has passed since a break, the store has let the
   * lock go. */
  readonly _ttlAsked: number;
  private readonly session: Session;
  private readonly resolveLost: (info: LostInfo) => void;
  /** Aborted when the lock is suspended or lost; a new one after each restore. */
  private controller = new AbortController();

  /** @internal */
  constructor(session: Session, key: string, holder: string, granted: GrantedMsg, ttlAsked: number) {
    super();
    this.session = session;
    this._ttlAsked = ttlAsked;
    this.key = key;
    this.holder = holder;
    this.fencingToken = BigInt(granted.fencingToken);
    this.ttl = seconds(granted.ttl);
    this.holdCount = granted.holdCount;
    this.sessionId = session.sessionId;
    let resolve!: (info: LostInfo) => void;
    this.lost = new Promise<LostInfo>((r) => (resolve = r));
    this.resolveLost = resolve;
  }

  /** True while the lock is held and may be used: false while it is suspended, and
   * for good once it is released or lost. */
  get held(): boolean {
    return this._state === 'held';
  }

  /** True from the moment the session's stream broke until the lock is restored or
   * lost: do not use it meanwhile. */
  get suspended(): boolean {
    return this._state === 'suspended';
  }

  /** Hand it to the work that uses the resource: aborted when the lock is suspended
   * (reason `LockSuspended`) or lost (`LockLost`). A restored lock has a new signal,
   * not aborted: read `lock.signal` again for work started after `'restored'`. */
  get signal(): AbortSignal {
    return this.controller.signal;
  }

  /** @internal The session's stream broke: stop using the lock. */
  _suspend(reason: string): void {
    if (this._state !== 'held') return;
    this._state = 'suspended';
    this.controller.abort(new LockSuspended(this.key, reason, this.fencingToken));
    this.tell('suspended', { key: this.key, reason, fencingToken: this.fencingToken });
  }

  /** @internal The resumed session listed the lock with its token. */
  _restore(): void {
    if (this._state !== 'suspended') return;
    this._state = 'held';
    this.controller = new AbortController();
    this.tell('restored', { key: this.key, fencingToken: this.fencingToken, sessionId: this.sessionId });
  }

  /** @internal */
  _markLost(reason: string): void {
    if (this._state !== 'held' && this._state !== 'suspended') return;
    this._state = 'lost';
    this.lostReason = reason;
    const info = { key: this.key, reason, fencingToken: this.fencingToken };
    this.resolveLost(info);
    // (A suspended lock's signal is aborted already: its reason then turns to LockLost
    // in a new signal.)
    if (this.controller.signal.aborted) this.controller = new AbortController();
    this.controller.abort(new LockLost(info.key, info.reason, info.fencingToken));
    this.tell('lost', info);
  }

  /** Emits `event`. A listener that throws does so on its own tick (an uncaught
   * exception, as from any emitter), not inside the session's bookkeeping. */
  private tell<K extends keyof LockEvents>(event: K, ...args: LockEvents[K]): void {
    try {
      // (TypeScript cannot narrow the emitter's conditional argument type for a generic K.)
      (this.emit as (event: K, ...args: LockEvents[K]) => boolean)(event, ...args);
    } catch (e) {
      process.nextTick(() => {
        throw e;
      });
    }
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

/** A request sent on the stream. */
type Request = LeaseRequest;

interface Pending {
  kind: 'acquire' | 'release' | 'proclaim';
  key: string;
  holder: string;
  /** What was sent: a release or a proclaim is sent again after a resume, since the
   * old stream may have broken before it arrived. */
  request: Request;
  /** An acquire's TTL in seconds (asked, else 0 for the session's default). */
  ttl: number;
  abandoned: boolean;
  /** The held lock of a Granted answer, made and put in `held` by the stream's data
   * handler, so a `Lost` in the same chunk of data finds it. */
  lock?: Lock;
  response?: LeaseResponse;
  settle: (response: LeaseResponse | null, error: Error | null) => void;
}

/** Stream endings that may mean the sidecar died: the session may be resumed. */
const RESUMABLE_CODES = new Set([grpc.status.UNAVAILABLE, grpc.status.INTERNAL, grpc.status.UNKNOWN, grpc.status.CANCELLED]);
/** Resume attempts ending so will not succeed by retrying (FAILED_PRECONDITION is
 * retried: a restarted sidecar refuses while the dead one's attachment lives). */
const FINAL_RESUME_CODES = new Set([
  grpc.status.UNIMPLEMENTED,
  grpc.status.UNAUTHENTICATED,
  grpc.status.PERMISSION_DENIED,
  grpc.status.INVALID_ARGUMENT,
]);
const FIRST_RESUME_BACKOFF_MS = 50;
const MAX_RESUME_BACKOFF_MS = 500;
const ANSWERS = new Set(['granted', 'notAcquired', 'rejected', 'released', 'proclaimed']);

/** Where a session keeps what concerns one holder's grant of one key: reentrancy is per
 * (session, holder, key), and every event names both. */
function slot(holder: string, key: string): string {
  return JSON.stringify([holder, key]);
}

/** How long a channel whose last connection attempt failed may take to try again:
 * the longest reconnect backoff (`CHANNEL_OPTIONS`, 1 s) and gRPC's 20 % jitter. */
const RECONNECT_GRACE_MS = 1200;

/** Connection errors that say nobody listens at the address. */
const NOBODY_LISTENS = /ECONNREFUSED|ENOENT|ENOTFOUND|Name resolution failed/;

/** Whether the channel connects within `ms` (false when it is closed meanwhile). */
async function readyWithin(stub: LockServiceClient, ms: number): Promise<boolean> {
  const until = performance.now() + ms;
  for (;;) {
    const left = until - performance.now();
    if (left <= 0) return false;
    // (One step at a time: gRPC arms a Node timer for the whole deadline.)
    const step = Math.min(left, MAX_TIMER_MS);
    const err = await new Promise<Error | undefined>((resolve) => stub.waitForReady(Date.now() + step, resolve));
    if (!err) return true;
    if (stub.getChannel().getConnectivityState(false) === grpc.connectivityState.SHUTDOWN) return false;
  }
}

/** Why a call found no sidecar, from gRPC's "No connection established. Last error:
 * Error: connect ECONNREFUSED 127.0.0.1:7420. Resolution note: ..." */
function connectError(err: grpc.ServiceError): string {
  const cause = String(err.details || err.message)
    .replace(/\s*Resolution note:.*$/s, '')
    .replace(/^No connection established\. Last error: (Error: )?/, '')
    .replace(/\.$/, '');
  return cause === 'null' ? 'the last connection attempt failed' : cause;
}

function statusText(err: grpc.ServiceError): string {
  const details = String(err.details || err.message).replace(/\s*Resolution note:.*$/s, '');
  return `${grpc.status[err.code] ?? err.code}: ${details}`;
}

/**
 * One session. Answers are matched by `request_id`; `Lost`, `Jeopardy` and `Restored`
 * are routed by (holder, key), the sidecar's echo of `Acquire.holder`, to every lock of
 * that holder on that key (reentrant grants of one holder share it).
 *
 * When the stream breaks (DESIGN.md, "A broken stream"), every held lock is suspended
 * at once: from the client's side a connection to a live sidecar that broke (a reset,
 * a stall its keepalive noticed) looks like a sidecar that died, and a live sidecar
 * releases at once. If the session holds locks and may be resumed (UNAVAILABLE, a
 * reset stream; a resume token), it resumes (DESIGN.md, "Sessions that survive a
 * sidecar restart"): waits in progress fail with `Unavailable` (the sidecar does not
 * resume them), and new streams with `lockside-resume: <token>` are opened with backoff
 * until one answers; the locks that come back with their fencing tokens are restored
 * (the same session id, tokens and hold counts), unanswered releases and proclaims are
 * sent again, and a lock is lost when it comes back `Lost` or does not come back, or
 * when its TTL has passed since the break (or the time an open `Jeopardy` gave) before
 * that: the store has let it go by then. Otherwise, when the stream ends, every pending
 * request fails and every held lock is lost; the client opens a new session for the
 * next request.
 * @internal
 */
class Session {
  sessionId = '';
  ended?: string;
  state: 'open' | 'resuming' | 'ended' = 'open';
  private defaultTtl = 0;
  private resumeToken = '';
  private nextId = 1;
  private readonly pending = new Map<string, Pending>();
  /** The locks held, by `slot(holder, key)`. */
  private readonly held = new Map<string, Lock[]>();
  /** Slots in Jeopardy: when they stop being surely held (performance.now() ms). */
  private readonly jeopardy = new Map<string, number>();
  /** While resuming: when the store has surely let each slot go (performance.now() ms):
   * the lock's TTL after the break, or the end of an open Jeopardy. */
  private readonly goneBy = new Map<string, number>();
  private timers: { cancel(): void }[] = [];
  private brokeReason = '';
  /** Why the last resume attempt failed, for the reason of a loss. */
  private resumeFailed = '';
  private attempt?: LeaseCall;
  /** Resolves the wait of callers while the session resumes. */
  private settled: Promise<void> = Promise.resolve();
  private markSettled: () => void = () => undefined;
  private closing = false;
  private readonly done: Promise<void>;
  private markDone!: () => void;

  private constructor(
    private call: LeaseCall,
    private readonly stub: LockServiceClient,
    private readonly metadata: grpc.Metadata,
    private readonly options: { resume: boolean },
  ) {
    this.done = new Promise((r) => (this.markDone = r));
  }

  /**
   * Opens a session on the sidecar at `addr`. With nothing listening there (connection
   * refused, no such socket, a name that does not resolve) it fails at once, naming the
   * address and the cause, unless `waitForSidecar` seconds allow waiting for a sidecar
   * to start: then it says so in one line on the console and connects as soon as one
   * listens. A sidecar that accepts the connection has `connectTimeout` seconds to
   * open the session.
   */
  static async open(
    addr: string,
    stub: LockServiceClient,
    metadata: grpc.Metadata,
    timing: { connectTimeout: number; waitForSidecar: number },
    options: { resume: boolean },
  ): Promise<Session> {
    const channel = stub.getChannel();
    const waitUntil = performance.now() + timing.waitForSidecar * 1000;
    let waited = false;
    for (;;) {
      // Only a refusal seen now means that nobody listens. A channel whose last attempt
      // failed fails new calls at once with that attempt's error until its next attempt
      // (gRPC's reconnect backoff; channels to one address share their connections, so
      // a new client may inherit the failure, without its cause): such an error may be
      // older than a sidecar started since.
      const stale = channel.getConnectivityState(false) === grpc.connectivityState.TRANSIENT_FAILURE;
      const opened = await Session.attempt(addr, stub, metadata, timing.connectTimeout, options);
      if (opened instanceof Session) return opened;
      const refused = !stale && NOBODY_LISTENS.test(opened.noSidecar);
      const left = waitUntil - performance.now();
      if (left > 0) {
        if (!waited) {
          console.warn(`lockside: no sidecar at ${addr} yet (${opened.noSidecar}); waiting up to ${timing.waitForSidecar} s for one`);
        }
        waited = true;
        await readyWithin(stub, left);
        continue;
      }
      if (!refused && !waited) {
        waited = true;
        if (await readyWithin(stub, RECONNECT_GRACE_MS)) continue;
      }
      const hint = timing.waitForSidecar > 0 ? ` (waited ${timing.waitForSidecar} s)` : '; to wait for one, pass { waitForSidecar: seconds }';
      throw new Unavailable(`no sidecar at ${addr}: ${opened.noSidecar}${hint}`, grpc.status.UNAVAILABLE);
    }
  }

  /** One Lease stream: the session once it starts; `noSidecar` (why) when the stream
   * failed UNAVAILABLE before any sidecar answered; rejects otherwise. */
  private static attempt(
    addr: string,
    stub: LockServiceClient,
    metadata: grpc.Metadata,
    timeoutS: number,
    options: { resume: boolean },
  ): Promise<Session | { noSidecar: string }> {
    return new Promise((resolve, reject) => {
      let call: LeaseCall;
      try {
        call = stub.Lease(metadata);
      } catch (e) {
        reject(new Unavailable(`cannot open a session: ${(e as Error).message}`)); // the channel is closed
        return;
      }
      let answered = false; // response headers came: a sidecar is there
      call.on('metadata', () => (answered = true));
      const session = new Session(call, stub, metadata, options);
      const timer = later(timeoutS * 1000, () => {
        call.cancel();
        reject(new Unavailable(`no answer from the sidecar at ${addr} within ${timeoutS} s`));
      });
      session.start((err, status) => {
        timer.cancel();
        if (!err) resolve(session);
        else if (status?.code === grpc.status.UNAVAILABLE && !answered) resolve({ noSidecar: connectError(status) });
        else reject(err);
      });
    });
  }

  /** Reads the first stream: SessionStarted, then everything else. */
  private start(opened: (err: Error | null, status?: grpc.ServiceError) => void): void {
    const call = this.call;
    let first = true;
    call.on('data', (resp: LeaseResponse) => {
      if (!first) {
        this.dispatch(resp);
        return;
      }
      first = false;
      if (resp.event !== 'started' || !resp.started) {
        call.cancel();
        opened(new Unavailable(`protocol error: the stream opened with ${resp.event}, not SessionStarted`));
        return;
      }
      this.started(resp.started);
      this.follow(call);
      opened(null);
    });
    const fail = (reason: string, code?: number, status?: grpc.ServiceError) => {
      if (!first) return;
      first = false;
      opened(new Unavailable(`cannot open a session: ${reason}`, code), status);
      this.end(reason, code);
    };
    call.on('error', (err: grpc.ServiceError) => fail(statusText(err), err.code, err));
    call.on('status', () => fail('the stream ended'));
  }

  private started(started: NonNullable<LeaseResponse['started']>): void {
    this.sessionId = started.sessionId;
    this.defaultTtl = seconds(started.defaultTtl);
    this.resumeToken = started.resumeToken ?? '';
  }

  /** Follows the end of `call`, the session's stream (once it has started). */
  private follow(call: LeaseCall): void {
    let over = false;
    const ended = (code: number | undefined, details: string) => {
      if (over) return;
      over = true;
      if (call !== this.call) return; // an old stream
      const reason = this.closing
        ? 'client closed'
        : code === undefined || code === grpc.status.OK
          ? 'closed by the sidecar'
          : `${grpc.status[code] ?? code}: ${details}`;
      this.broke(reason, code, details);
    };
    // An 'error' (a status other than OK) comes before 'status', which always comes.
    call.on('error', (err: grpc.ServiceError) => ended(err.code, String(err.details ?? err.message)));
    call.on('status', (status: grpc.StatusObject) => ended(status.code, status.details));
  }

  private dispatch(resp: LeaseResponse): void {
    const event = resp.event;
    if (event === undefined) return;
    if (ANSWERS.has(event)) {
      this.answered(event, resp);
      return;
    }
    switch (event) {
      case 'lost': {
        const lost = resp.lost!;
        for (const s of this.slotsOf(lost.holder, lost.key)) {
          this.jeopardy.delete(s);
          const locks = this.held.get(s) ?? [];
          this.held.delete(s);
          for (const lock of locks) lock._markLost(lost.reason || 'Lost');
        }
        return;
      }
      case 'jeopardy': {
        const until = performance.now() + seconds(resp.jeopardy!.ttlRemaining) * 1000;
        for (const s of this.slotsOf(resp.jeopardy!.holder, resp.jeopardy!.key)) this.jeopardy.set(s, until);
        return;
      }
      case 'restored':
        for (const s of this.slotsOf(resp.restored!.holder, resp.restored!.key)) this.jeopardy.delete(s);
        return;
      default:
        return; // waiting: informational
    }
  }

  /** The held slots an event about (holder, key) concerns: that holder's. An event
   * with holder "" about a key no lock holds as "" comes from a sidecar that knows no
   * holders (older than the `holder` field): it speaks of the whole session's grant,
   * that is of every holder's lock of the key. */
  private slotsOf(holder: string | undefined, key: string): string[] {
    const exact = slot(holder ?? '', key);
    if (holder || this.held.has(exact)) return [exact];
    const all: string[] = [];
    for (const [s, locks] of this.held) if (locks[0]?.key === key) all.push(s);
    return all;
  }

  private answered(event: string, resp: LeaseResponse): void {
    const answer = resp[event as keyof LeaseResponse] as AnswerMsg;
    const pending = this.pending.get(answer.requestId);
    // None: the answer to an abandoned cancel-Release, or to a Release this session
    // sent on its own (a grant nobody waited for, a hold found after a resume).
    if (!pending) return;
    this.pending.delete(answer.requestId);
    if (event === 'granted') {
      if (pending.abandoned) {
        this.sendRelease(pending.holder, pending.key); // nobody waits for this grant any more
        return;
      }
      const lock = new Lock(this, pending.key, pending.holder, resp.granted!, pending.ttl || this.defaultTtl);
      const s = slot(pending.holder, pending.key);
      const locks = this.held.get(s);
      if (locks) locks.push(lock);
      else this.held.set(s, [lock]);
      pending.lock = lock;
    }
    pending.settle(resp, null);
  }

  /** Sends a Release nobody waits for; dropped unless the stream is up (a resume
   * reconciles hold counts). */
  private sendRelease(holder: string, key: string): void {
    const requestId = String(this.nextId++);
    if (this.state === 'open') this.call.write({ release: { requestId, key, holder } });
  }

  /** The caller gave up on `rid` (timeout, abort). See the Python client's notes. */
  private abandon(rid: string, pending: Pending): void {
    if (this.pending.get(rid) !== pending) return;
    pending.abandoned = true;
    if (pending.kind === 'acquire' && !this.held.get(slot(pending.holder, pending.key))?.length && this.state === 'open') {
      // A Release of a key the holder only waits for cancels the wait.
      this.pending.delete(rid);
      this.sendRelease(pending.holder, pending.key);
    }
  }

  /** The session is over: fail what waits, lose what is held. */
  private end(reason: string, code?: number): void {
    if (this.state === 'ended') return;
    this.state = 'ended';
    this.ended = reason;
    for (const pending of this.pending.values()) {
      pending.settle(null, new Unavailable(`lease stream ended: ${reason}`, code));
    }
    this.pending.clear();
    for (const locks of this.held.values()) for (const lock of locks) lock._markLost(reason);
    this.held.clear();
    this.goneBy.clear();
    this.stateChanged();
    this.markDone();
  }

  private stateChanged(): void {
    for (const timer of this.timers) timer.cancel();
    this.timers = [];
    this.markSettled();
  }

  // -- resuming -------------------------------------------------------------------

  /** The stream ended with `code`: suspend every lock and resume the session, or end
   * it (every lock lost). */
  private broke(reason: string, code: number | undefined, details: string): void {
    if (this.state === 'ended') return;
    if (this.closing) {
      this.end('client closed', code);
      return;
    }
    if (this.held.size > 0 && this.resumeToken === '' && this.options.resume) {
      // The sidecar's store cannot resume sessions (the embedded memory store: its locks
      // died with the sidecar, or a live sidecar released them).
      reason = `${reason}; the sidecar's store cannot resume sessions (no resume token)`;
    }
    const resumable =
      this.options.resume &&
      this.resumeToken !== '' &&
      this.held.size > 0 &&
      code !== undefined &&
      RESUMABLE_CODES.has(code) &&
      // A sidecar stopping cleanly says Lost for every lock, releases, then ends its
      // streams UNAVAILABLE saying so: nothing is left to resume.
      !details.includes('shutting down');
    if (!resumable) {
      this.end(reason, code);
      return;
    }
    this.state = 'resuming';
    this.brokeReason = reason;
    this.resumeFailed = '';
    this.settled = new Promise((r) => (this.markSettled = r));
    // First of all, before anything else runs: a live sidecar releases this stream's
    // locks at once (after its short grace), and a waiter elsewhere may be granted
    // within milliseconds.
    for (const locks of this.held.values()) for (const lock of locks) lock._suspend(reason);
    // The sidecar does not resume waits in progress: their callers hear it now.
    for (const [rid, p] of this.pending) {
      if (p.kind !== 'acquire') continue;
      this.pending.delete(rid);
      p.settle(
        null,
        new Unavailable(
          `the stream to the sidecar broke while waiting (${reason}); the sidecar does not resume waits in progress: ask again`,
          code,
        ),
      );
    }
    const now = performance.now();
    for (const [s, locks] of this.held) {
      const ttl = Math.min(...locks.map((l) => l._ttlAsked));
      this.goneBy.set(s, this.jeopardy.get(s) ?? now + ttl * 1000);
    }
    const next = this.expire(now);
    if (next === undefined) return;
    this.armExpiry(next);
    void this.resume();
  }

  /** While resuming: loses every key the store has surely let go; the next such time,
   * or undefined when nothing is held any more (the session then ends). */
  private expire(now: number): number | undefined {
    if (this.state !== 'resuming') return undefined;
    const last = this.resumeFailed ? `; the last attempt: ${this.resumeFailed}` : '';
    const why = `the stream to the sidecar broke (${this.brokeReason}) and the session was not resumed before the lock's TTL passed${last}`;
    for (const [s, until] of this.goneBy) {
      if (until > now) continue;
      this.goneBy.delete(s);
      for (const lock of this.held.get(s) ?? []) lock._markLost(why);
      this.held.delete(s);
    }
    if (this.held.size === 0) {
      this.end(why, grpc.status.UNAVAILABLE);
      return undefined;
    }
    return Math.min(...this.goneBy.values());
  }

  /** Loses keys when their TTL has passed since the break: one timer, for the next
   * such time (a timer may fire a little early: it is then armed again). */
  private armExpiry(at: number): void {
    this.timers.push(later(at - performance.now(), () => this.onExpiry()));
  }

  private onExpiry(): void {
    const next = this.expire(performance.now());
    if (next !== undefined) this.armExpiry(next);
    else if (this.state === 'ended') this.attempt?.cancel();
  }

  /** Opens new streams with the resume token, with backoff, until one answers or
   * nothing is held any more. */
  private async resume(): Promise<void> {
    let backoff = FIRST_RESUME_BACKOFF_MS;
    while (this.state === 'resuming') {
      const metadata = this.metadata.clone();
      metadata.set('lockside-resume', this.resumeToken);
      const call = this.stub.Lease(metadata);
      this.attempt = call;
      const failed = await this.greeting(call);
      this.attempt = undefined;
      if (failed === undefined || this.state !== 'resuming') return;
      call.cancel();
      this.resumeFailed = failed.why;
      if (failed.code !== undefined && FINAL_RESUME_CODES.has(failed.code)) {
        this.end(`${this.brokeReason}; resuming failed: ${failed.why}`, failed.code);
        return;
      }
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([this.settled, new Promise<void>((r) => (timer = setTimeout(r, backoff)))]);
      clearTimeout(timer);
      backoff = Math.min(backoff * 2, MAX_RESUME_BACKOFF_MS);
    }
  }

  /** Reads a resume attempt's SessionStarted and the Granted/Lost events that follow,
   * and then makes the stream the session's, in the same tick (so that no message
   * after them goes unrouted). Resolves undefined then, else why it failed. */
  private greeting(call: LeaseCall): Promise<{ why: string; code?: number } | undefined> {
    return new Promise((resolve) => {
      let started: NonNullable<LeaseResponse['started']> | undefined;
      const events: LeaseResponse[] = [];
      let over = false;
      const finish = (failed: { why: string; code?: number } | undefined) => {
        if (over) return;
        over = true;
        call.removeListener('data', onData);
        resolve(failed);
      };
      const onData = (resp: LeaseResponse) => {
        if (!started) {
          if (resp.event !== 'started' || !resp.started) {
            finish({ why: `protocol error: a resume opened with ${resp.event}` });
            return;
          }
          started = resp.started;
          // A resume answers with a new token: the old one is spent.
          this.resumeToken = started.resumeToken ?? '';
        } else {
          events.push(resp);
        }
        if (events.length < (started.resumedLocks ?? 0)) return;
        finish(undefined);
        this.takeOver(call, started, events);
      };
      call.on('data', onData);
      call.on('error', (err: grpc.ServiceError) => finish({ why: statusText(err), code: err.code }));
      call.on('status', (status: grpc.StatusObject) =>
        finish({ why: `${grpc.status[status.code] ?? status.code}: ${status.details}`, code: status.code }),
      );
    });
  }

  /** A resume attempt answered: its stream becomes the session's. */
  private takeOver(call: LeaseCall, started: NonNullable<LeaseResponse['started']>, events: LeaseResponse[]): void {
    if (this.state !== 'resuming') {
      call.cancel();
      return;
    }
    if (started.sessionId !== this.sessionId) {
      call.cancel();
      this.end('a resume answered with another session');
      return;
    }
    this.call = call;
    call.on('data', (resp: LeaseResponse) => {
      if (call === this.call) this.dispatch(resp);
    });
    this.follow(call);
    for (const request of this.resumed(started, events)) call.write(request);
    // Once what the resume owes the sidecar is on its way: a listener may release.
    for (const locks of [...this.held.values()]) for (const lock of locks) lock._restore();
  }

  /**
   * A resume was answered: reconciles the held locks with what came back and returns
   * the requests to send on the new stream, in order. A key comes back with the
   * session's hold count in the store: a Release not answered may have been applied
   * before the sidecar died, so as many of those as the count says were are taken as
   * answered and the others are sent again; holds the store has and nobody here knows
   * of (a grant whose answer was lost, a key already reported lost) are given back.
   */
  private resumed(started: NonNullable<LeaseResponse['started']>, events: LeaseResponse[]): Request[] {
    this.state = 'open';
    this.resumeToken = started.resumeToken ?? '';
    this.goneBy.clear();
    this.jeopardy.clear();
    // Each holder's grant comes back on its own (Granted with request_id 0 and its
    // holder), and is matched with that holder's locks only.
    const granted = new Map<string, GrantedMsg>();
    const lost = new Map<string, string>();
    for (const e of events) {
      if (e.event === 'granted') granted.set(slot(e.granted!.holder ?? '', e.granted!.key), e.granted!);
      else if (e.event === 'lost') lost.set(slot(e.lost!.holder ?? '', e.lost!.key), e.lost!.reason);
    }
    const out: Request[] = [];
    const giveBack = (back: GrantedMsg, holds: number) => {
      for (let i = 0; i < holds; i++) {
        out.push({ release: { requestId: String(this.nextId++), key: back.key, holder: back.holder ?? '' } });
      }
    };
    const byId = [...this.pending.entries()].sort((a, b) => (BigInt(a[0]) < BigInt(b[0]) ? -1 : 1));
    const releases = new Map<string, string[]>();
    for (const [rid, p] of byId) {
      if (p.kind !== 'release') continue;
      const s = slot(p.holder, p.key);
      const list = releases.get(s);
      if (list) list.push(rid);
      else releases.set(s, [rid]);
    }
    for (const [s, locks] of [...this.held]) {
      const back = granted.get(s);
      granted.delete(s);
      const loseAll = (why: string) => {
        for (const lock of locks) lock._markLost(why);
        this.held.delete(s);
      };
      if (!back || BigInt(back.fencingToken) !== locks[0].fencingToken) {
        loseAll(`lost while the sidecar was away: ${lost.get(s) || 'the resumed session did not list it'}`);
        if (back) giveBack(back, back.holdCount);
        continue;
      }
      const unanswered = releases.get(s) ?? [];
      const applied = Math.min(unanswered.length, Math.max(0, locks.length - back.holdCount));
      for (const rid of unanswered.slice(0, applied)) {
        const done = this.pending.get(rid)!;
        this.pending.delete(rid);
        // (Holds left: the store's count, which counts these releases as applied.)
        const released = { requestId: rid, key: back.key, holdCount: back.holdCount, holder: done.holder };
        done.settle({ event: 'released', released }, null);
      }
      const surplus = back.holdCount + applied - locks.length;
      if (surplus < 0) {
        loseAll('the resumed session holds the key fewer times than granted');
        giveBack(back, back.holdCount);
        continue;
      }
      giveBack(back, surplus);
    }
    for (const back of granted.values()) giveBack(back, back.holdCount);
    // Unanswered releases and proclaims go again, in their order; those of keys that
    // did not come back fail now (their locks are lost).
    for (const [rid, p] of byId) {
      if (!this.pending.has(rid)) continue;
      if (p.kind !== 'acquire' && this.held.has(slot(p.holder, p.key))) {
        out.push(p.request);
        continue;
      }
      this.pending.delete(rid);
      // (No acquire is pending here: acquires wait for the resume to end.)
      const why = p.kind === 'acquire' ? 'the session was resumed: ask again' : 'the lock was lost while the sidecar was away';
      p.settle(null, new Unavailable(why));
    }
    this.stateChanged();
    return out;
  }

  // -- callers ----------------------------------------------------------------------

  /** Waits while the session resumes; throws if it ended. */
  private async ready(): Promise<void> {
    while (this.state === 'resuming') await this.settled;
    if (this.state === 'ended') throw new Unavailable(`lease stream ended: ${this.ended}`);
  }

  private request(
    kind: Pending['kind'],
    key: string,
    holder: string,
    message: Request,
    rid: string,
    timeoutS: number,
    signal?: AbortSignal,
    ttl = 0,
  ): Promise<Pending> {
    return new Promise((resolve, reject) => {
      let onAbort: (() => void) | undefined;
      const expire = () => {
        if (this.pending.get(rid) === pending && this.state === 'resuming' && kind !== 'acquire') {
          timer = later(timeoutS * 1000, expire); // sent again once resumed, or failed
          return;
        }
        this.abandon(rid, pending);
        settle(null, new Unavailable(`no answer from the sidecar within ${timeoutS} s`));
      };
      let timer = later(timeoutS * 1000, expire);
      const settle = (response: LeaseResponse | null, error: Error | null) => {
        timer.cancel();
        if (onAbort) signal!.removeEventListener('abort', onAbort);
        if (error) reject(error);
        else {
          pending.response = response!;
          resolve(pending);
        }
      };
      const pending: Pending = { kind, key, holder, request: message, ttl, abandoned: false, settle };
      if (signal) {
        onAbort = () => {
          this.abandon(rid, pending);
          settle(null, signal.reason instanceof Error ? signal.reason : new LocksideError('aborted', key));
        };
        signal.addEventListener('abort', onAbort, { once: true });
      }
      this.pending.set(rid, pending);
      if (this.state === 'open') this.call.write(message);
    });
  }

  /** Takes `key` for `holder` (see `Client.lock`). */
  async acquire(key: string, holder: string, opts: LockOptions): Promise<Lock> {
    checkText('key', key);
    checkText('holder', holder);
    const limit = opts.limit ?? 0;
    if (!Number.isInteger(limit) || limit < 0 || limit > 0xffffffff) {
      throw new RangeError(`limit must be an integer between 0 and 2**32-1, got ${String(limit)}`);
    }
    const wait = opts.wait ?? MAX_WAIT_SECONDS;
    const value = toValue('value', opts.value);
    checkSize(key, holder, value);
    const acquire: Acquire = {
      key,
      mode: opts.shared ? 'LOCK_MODE_SHARED' : 'LOCK_MODE_EXCLUSIVE',
      limit,
      fair: Boolean(opts.fair),
      value,
      holder,
    };
    const waitTimeout = duration('wait', wait);
    if (wait > 0) acquire.waitTimeout = waitTimeout;
    if (opts.ttl !== undefined) acquire.ttl = duration('ttl', opts.ttl);
    if (opts.signal?.aborted) throw opts.signal.reason;
    if (this.state !== 'open') await this.ready();
    const rid = String(this.nextId++);
    acquire.requestId = rid;
    // The sidecar answers a wait over its maximum at once (Rejected INVALID_ARGUMENT),
    // and never waits longer than that maximum.
    const answerWithin = Math.min(wait, MAX_WAIT_SECONDS) + ANSWER_SLACK_SECONDS;
    const pending = await this.request('acquire', key, holder, { acquire }, rid, answerWithin, opts.signal, opts.ttl ?? 0);
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
      const release = { requestId: rid, key: lock.key, holder: lock.holder };
      resp = (await this.request('release', lock.key, lock.holder, { release }, rid, ANSWER_SLACK_SECONDS)).response!;
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
      // Lost before the release, or the session ended: the sidecar may have died with
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
    checkSize(lock.key, lock.holder, bytes);
    if (lock._state === 'lost') throw new LockLost(lock.key, lock.lostReason ?? 'lost', lock.fencingToken);
    if (lock._state === 'released') throw new LocksideError(`lock ${shortKey(lock.key)} was released`, lock.key);
    if (this.state === 'ended') throw new Unavailable(`lease stream ended: ${this.ended}`);
    const rid = String(this.nextId++);
    const message = { proclaim: { requestId: rid, key: lock.key, value: bytes, holder: lock.holder } };
    const resp = (await this.request('proclaim', lock.key, lock.holder, message, rid, ANSWER_SLACK_SECONDS)).response!;
    if (resp.event === 'proclaimed') return;
    // (The await above may have changed the state: the sidecar sends `Lost` first.)
    if ((lock._state as Lock['_state']) === 'lost') {
      throw new LockLost(lock.key, lock.lostReason ?? 'lost', lock.fencingToken);
    }
    const r = resp.rejected!;
    throw new Rejected(lock.key, r.code ?? 0, r.message ?? '');
  }

  private forget(lock: Lock): void {
    const s = slot(lock.holder, lock.key);
    const locks = this.held.get(s);
    if (!locks) return;
    const i = locks.indexOf(lock);
    if (i >= 0) locks.splice(i, 1);
    if (locks.length === 0) {
      this.held.delete(s);
      this.jeopardy.delete(s);
    }
  }

  /** Half-closes the stream (the sidecar releases everything and ends it), waits up to
   * `timeoutMs` for that, then cancels. A session that is resuming ends at once (its
   * locks stay in the store until their TTL). */
  async close(timeoutMs = 2000): Promise<void> {
    this.closing = true;
    if (this.state === 'resuming') {
      this.end('client closed');
      this.attempt?.cancel();
      return;
    }
    if (this.state === 'open') this.call.end();
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([this.done, new Promise<void>((r) => (timer = setTimeout(r, timeoutMs)))]);
    clearTimeout(timer);
    if (this.state !== 'ended') {
      this.call.cancel();
      this.end('client closed');
    }
  }
}

// -- the client ----------------------------------------------------------------------

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
      this.opening = Session.open(this.addr, this.stub, this.metadata, this.timing, this.sessionOptions).finally(() => {
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
