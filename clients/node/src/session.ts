// One session: one Lease stream to the sidecar and everything sent and held on it.
import * as grpc from '@grpc/grpc-js';
import {
  LockLost,
  LocksideError,
  NotAcquired,
  type NotAcquiredReason,
  Rejected,
  Unavailable,
  causedBy,
  shortKey,
  statusText,
} from './errors.js';
import { MAX_WAIT_SECONDS, checkSize, checkText, toValue } from './limits.js';
import { Lock, type LockOptions, slot } from './lock.js';
import { Resume, resumable } from './resume.js';
import { later } from './timers.js';
import type { Acquire, AnswerMsg, LeaseCall, LeaseRequest, LeaseResponse, LockServiceClient, StartedMsg } from './wire.js';
import { duration, seconds } from './wire.js';

/** How long past its own wait an answer may take before the client gives up on it. */
const ANSWER_SLACK_SECONDS = 10;

/** A request sent and not answered yet. */
export interface Pending {
  kind: 'acquire' | 'release' | 'proclaim';
  key: string;
  holder: string;
  /** What was sent: a release or a proclaim is sent again after a resume, since the
   * old stream may have broken before it arrived. */
  request: LeaseRequest;
  /** An acquire's TTL in seconds (asked, else 0 for the session's default). */
  ttl: number;
  abandoned: boolean;
  /** The held lock of a Granted answer, made and put in `held` by the stream's data
   * handler, so a `Lost` in the same chunk of data finds it. */
  lock?: Lock;
  response?: LeaseResponse;
  settle: (response: LeaseResponse | null, error: Error | null) => void;
}

const ANSWERS = new Set(['granted', 'notAcquired', 'rejected', 'released', 'proclaimed']);

/**
 * One session. Answers are matched by `request_id`; `Lost`, `Jeopardy` and `Restored`
 * are routed by (holder, key), the sidecar's echo of `Acquire.holder`, to every lock of
 * that holder on that key (reentrant grants of one holder share it).
 *
 * When the stream breaks (DESIGN.md, "A broken stream"), every held lock is suspended
 * at once: from the client's side a connection to a live sidecar that broke (a reset,
 * a stall its keepalive noticed) looks like a sidecar that died, and a live sidecar
 * releases at once. If the session holds locks and may be resumed (UNAVAILABLE, a
 * reset stream; a resume token), waits in progress fail with `Unavailable` (the sidecar
 * does not resume them) and a `Resume` brings the session back or loses its locks one
 * by one (src/resume.ts). Otherwise, when the stream ends, every pending request fails
 * and every held lock is lost; the client opens a new session for the next request.
 * @internal
 */
export class Session {
  sessionId = '';
  ended?: string;
  /** The status the stream ended with, when that ended the session. */
  private endedBy?: Error;
  state: 'open' | 'resuming' | 'ended' = 'open';
  private defaultTtl = 0;
  private nextId = 1;
  // What a `Resume` reads and reconciles (src/resume.ts):
  /** The token that resumes the session; each resume answers with a new one. */
  resumeToken = '';
  /** Requests sent and not answered, by request id. */
  readonly pending = new Map<string, Pending>();
  /** The locks held, by `slot(holder, key)`. */
  readonly held = new Map<string, Lock[]>();
  /** Slots in Jeopardy: when they stop being surely held (performance.now() ms). */
  readonly jeopardy = new Map<string, number>();
  /** Resolves the wait of callers (and a resume's backoff) while the session resumes. */
  settled: Promise<void> = Promise.resolve();
  private markSettled: () => void = () => undefined;
  /** The resume after the last break (stopped once the session is open or ended). */
  private resume?: Resume;
  private closing = false;
  private readonly done: Promise<void>;
  private markDone!: () => void;

  /** A session on `call`, which `start()` reads (src/connect.ts opens it). */
  constructor(
    private call: LeaseCall,
    readonly stub: LockServiceClient,
    readonly metadata: grpc.Metadata,
    private readonly options: { resume: boolean },
  ) {
    this.done = new Promise((r) => (this.markDone = r));
  }

  /** A new request id. */
  newId(): string {
    return String(this.nextId++);
  }

  /** Reads the first stream: SessionStarted, then everything else. */
  start(opened: (err: Error | null, status?: grpc.ServiceError) => void): void {
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
      opened(new Unavailable(`cannot open a session: ${reason}`, code, causedBy(status)), status);
      this.end(reason, code, status);
    };
    call.on('error', (err: grpc.ServiceError) => fail(statusText(err), err.code, err));
    call.on('status', () => fail('the stream ended'));
  }

  private started(started: StartedMsg): void {
    this.sessionId = started.sessionId;
    this.defaultTtl = seconds(started.defaultTtl);
    this.resumeToken = started.resumeToken ?? '';
  }

  /** Follows the end of `call`, the session's stream (once it has started). */
  private follow(call: LeaseCall): void {
    let over = false;
    const ended = (code: number | undefined, details: string, cause?: grpc.ServiceError) => {
      if (over) return;
      over = true;
      if (call !== this.call) return; // an old stream
      const reason = this.closing
        ? 'client closed'
        : code === undefined || code === grpc.status.OK
          ? 'closed by the sidecar'
          : `${grpc.status[code] ?? code}: ${details}`;
      this.broke(reason, code, details, cause);
    };
    // An 'error' (a status other than OK) comes before 'status', which always comes.
    call.on('error', (err: grpc.ServiceError) => ended(err.code, String(err.details ?? err.message), err));
    call.on('status', (status: grpc.StatusObject) => ended(status.code, status.details));
  }

  /** A resume answered on `call`: it becomes the session's stream, and the session is
   * open again (its locks and requests are then reconciled: src/resume.ts). */
  reopen(call: LeaseCall, started: StartedMsg): void {
    this.call = call;
    call.on('data', (resp: LeaseResponse) => {
      if (call === this.call) this.dispatch(resp);
    });
    this.follow(call);
    this.state = 'open';
    this.resumeToken = started.resumeToken ?? '';
    this.jeopardy.clear();
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
    const requestId = this.newId();
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

  /** The session is over: fail what waits, lose what is held. `cause`: the status the
   * stream ended with, if that ended it. */
  end(reason: string, code?: number, cause?: Error): void {
    if (this.state === 'ended') return;
    this.state = 'ended';
    this.ended = reason;
    this.endedBy = cause;
    for (const pending of this.pending.values()) {
      pending.settle(null, new Unavailable(`lease stream ended: ${reason}`, code, causedBy(cause)));
    }
    this.pending.clear();
    for (const locks of this.held.values()) for (const lock of locks) lock._markLost(reason);
    this.held.clear();
    this.stateChanged();
    this.markDone();
  }

  /** The session no longer resumes (it is open again, or ended): the resume stops and
   * whoever waits for that goes on. */
  stateChanged(): void {
    this.resume?.stop();
    this.markSettled();
  }

  /** The stream ended with `code` (`cause`: its status, unless OK): suspend every lock
   * and resume the session, or end it (every lock lost). */
  private broke(reason: string, code: number | undefined, details: string, cause?: grpc.ServiceError): void {
    if (this.state === 'ended') return;
    if (this.closing) {
      this.end('client closed', code, cause);
      return;
    }
    if (this.held.size > 0 && this.resumeToken === '' && this.options.resume) {
      // The sidecar's store cannot resume sessions (the embedded memory store: its locks
      // died with the sidecar, or a live sidecar released them).
      reason = `${reason}; the sidecar's store cannot resume sessions (no resume token)`;
    }
    if (!(this.options.resume && this.resumeToken !== '' && this.held.size > 0 && resumable(code, details))) {
      this.end(reason, code, cause);
      return;
    }
    this.state = 'resuming';
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
          causedBy(cause),
        ),
      );
    }
    this.resume = new Resume(this, reason, cause);
    this.resume.start();
  }

  // -- callers ----------------------------------------------------------------------

  /** Waits while the session resumes; throws if it ended. */
  private async ready(): Promise<void> {
    while (this.state === 'resuming') await this.settled;
    if (this.state === 'ended') throw new Unavailable(`lease stream ended: ${this.ended}`, undefined, causedBy(this.endedBy));
  }

  private request(
    kind: Pending['kind'],
    key: string,
    holder: string,
    message: LeaseRequest,
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
    const rid = this.newId();
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
    const rid = this.newId();
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
      throw new LockLost(lock.key, lock.lostReason, lock.fencingToken, causedBy(error));
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
    if (this.state === 'ended') throw new Unavailable(`lease stream ended: ${this.ended}`, undefined, causedBy(this.endedBy));
    const rid = this.newId();
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
      this.resume?.cancel();
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
