// Resuming a session whose stream broke (DESIGN.md, "Sessions that survive a sidecar
// restart"): new streams with `lockside-resume: <token>`, with backoff, until one
// answers; the locks that come back with their fencing tokens are restored (the same
// session id, tokens and hold counts), unanswered releases and proclaims are sent
// again, and a lock is lost when it comes back `Lost` or does not come back, or when
// its TTL has passed since the break (or the time an open `Jeopardy` gave) before that:
// the store has let it go by then.
import * as grpc from '@grpc/grpc-js';
import { Unavailable, statusText } from './errors.js';
import { slot } from './lock.js';
import type { Session } from './session.js';
import { later } from './timers.js';
import type { GrantedMsg, LeaseCall, LeaseRequest, LeaseResponse, StartedMsg } from './wire.js';

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

/** Whether a stream that ended with `code` and `details` may be resumed (if the session
 * holds locks and has a resume token). */
export function resumable(code: number | undefined, details: string): boolean {
  return (
    code !== undefined &&
    RESUMABLE_CODES.has(code) &&
    // A sidecar stopping cleanly says Lost for every lock, releases, then ends its
    // streams UNAVAILABLE saying so: nothing is left to resume.
    !details.includes('shutting down')
  );
}

/** Why a resume attempt failed: its status, when it ended with one. */
interface Failed {
  why: string;
  code?: number;
  status?: grpc.ServiceError;
}

/**
 * The resume of one session after one break, from the moment its locks are suspended
 * until it is open again (`takeOver`) or ended (a lock lost per TTL passed, resuming
 * refused for good, the client closed).
 */
export class Resume {
  /** When the store has surely let each slot go (performance.now() ms): the lock's TTL
   * after the break, or the end of an open Jeopardy. */
  private readonly goneBy = new Map<string, number>();
  private timers: { cancel(): void }[] = [];
  /** Why the last resume attempt failed, for the reason of a loss. */
  private resumeFailed = '';
  /** The resume attempt in flight. */
  private attempt?: LeaseCall;

  /** `brokeReason`: how the stream broke; `brokeBy`: its status. */
  constructor(
    private readonly session: Session,
    private readonly brokeReason: string,
    private readonly brokeBy?: grpc.ServiceError,
  ) {}

  /** Starts the clock on every held lock and the attempts. */
  start(): void {
    const now = performance.now();
    for (const [s, locks] of this.session.held) {
      const ttl = Math.min(...locks.map((l) => l._ttlAsked));
      this.goneBy.set(s, this.session.jeopardy.get(s) ?? now + ttl * 1000);
    }
    const next = this.expire(now);
    if (next === undefined) return;
    this.armExpiry(next);
    void this.resume();
  }

  /** The session no longer resumes: no more losses by TTL. */
  stop(): void {
    for (const timer of this.timers) timer.cancel();
    this.timers = [];
    this.goneBy.clear();
  }

  /** Cancels the attempt in flight (the session ended). */
  cancel(): void {
    this.attempt?.cancel();
  }

  /** While resuming: loses every key the store has surely let go; the next such time,
   * or undefined when nothing is held any more (the session then ends). */
  private expire(now: number): number | undefined {
    if (this.session.state !== 'resuming') return undefined;
    const last = this.resumeFailed ? `; the last attempt: ${this.resumeFailed}` : '';
    const why = `the stream to the sidecar broke (${this.brokeReason}) and the session was not resumed before the lock's TTL passed${last}`;
    for (const [s, until] of this.goneBy) {
      if (until > now) continue;
      this.goneBy.delete(s);
      for (const lock of this.session.held.get(s) ?? []) lock._markLost(why);
      this.session.held.delete(s);
    }
    if (this.session.held.size === 0) {
      this.session.end(why, grpc.status.UNAVAILABLE, this.brokeBy);
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
    else if (this.session.state === 'ended') this.attempt?.cancel();
  }

  /** Opens new streams with the resume token, with backoff, until one answers or
   * nothing is held any more. */
  private async resume(): Promise<void> {
    let backoff = FIRST_RESUME_BACKOFF_MS;
    while (this.session.state === 'resuming') {
      const metadata = this.session.metadata.clone();
      metadata.set('lockside-resume', this.session.resumeToken);
      const call = this.session.stub.Lease(metadata);
      this.attempt = call;
      const failed = await this.greeting(call);
      this.attempt = undefined;
      if (failed === undefined || this.session.state !== 'resuming') return;
      call.cancel();
      this.resumeFailed = failed.why;
      if (failed.code !== undefined && FINAL_RESUME_CODES.has(failed.code)) {
        this.session.end(`${this.brokeReason}; resuming failed: ${failed.why}`, failed.code, failed.status);
        return;
      }
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([this.session.settled, new Promise<void>((r) => (timer = setTimeout(r, backoff)))]);
      clearTimeout(timer);
      backoff = Math.min(backoff * 2, MAX_RESUME_BACKOFF_MS);
    }
  }

  /** Reads a resume attempt's SessionStarted and the Granted/Lost events that follow,
   * and then makes the stream the session's, in the same tick (so that no message
   * after them goes unrouted). Resolves undefined then, else why it failed. */
  private greeting(call: LeaseCall): Promise<Failed | undefined> {
    return new Promise((resolve) => {
      let started: StartedMsg | undefined;
      const events: LeaseResponse[] = [];
      let over = false;
      const finish = (failed: Failed | undefined) => {
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
          this.session.resumeToken = started.resumeToken ?? '';
        } else {
          events.push(resp);
        }
        if (events.length < (started.resumedLocks ?? 0)) return;
        finish(undefined);
        this.takeOver(call, started, events);
      };
      call.on('data', onData);
      call.on('error', (err: grpc.ServiceError) => finish({ why: statusText(err), code: err.code, status: err }));
      call.on('status', (status: grpc.StatusObject) =>
        finish({ why: `${grpc.status[status.code] ?? status.code}: ${status.details}`, code: status.code }),
      );
    });
  }

  /** A resume attempt answered: its stream becomes the session's. */
  private takeOver(call: LeaseCall, started: StartedMsg, events: LeaseResponse[]): void {
    if (this.session.state !== 'resuming') {
      call.cancel();
      return;
    }
    if (started.sessionId !== this.session.sessionId) {
      call.cancel();
      this.session.end('a resume answered with another session');
      return;
    }
    this.session.reopen(call, started);
    const requests = reconcile(this.session, events);
    this.session.stateChanged(); // (stops this resume)
    for (const request of requests) call.write(request);
    // Once what the resume owes the sidecar is on its way: a listener may release.
    for (const locks of [...this.session.held.values()]) for (const lock of locks) lock._restore();
  }
}

/**
 * A resume was answered: reconciles the session's held locks and pending requests with
 * what came back and returns the requests to send on the new stream, in order. A key
 * comes back with the session's hold count in the store: a Release not answered may
 * have been applied before the sidecar died, so as many of those as the count says
 * were are taken as answered and the others are sent again; holds the store has and
 * nobody here knows of (a grant whose answer was lost, a key already reported lost) are
 * given back.
 */
function reconcile(session: Session, events: LeaseResponse[]): LeaseRequest[] {
  // Each holder's grant comes back on its own (Granted with request_id 0 and its
  // holder), and is matched with that holder's locks only.
  const granted = new Map<string, GrantedMsg>();
  const lost = new Map<string, string>();
  for (const e of events) {
    if (e.event === 'granted') granted.set(slot(e.granted!.holder ?? '', e.granted!.key), e.granted!);
    else if (e.event === 'lost') lost.set(slot(e.lost!.holder ?? '', e.lost!.key), e.lost!.reason);
  }
  const out: LeaseRequest[] = [];
  const giveBack = (back: GrantedMsg, holds: number) => {
    for (let i = 0; i < holds; i++) {
      out.push({ release: { requestId: session.newId(), key: back.key, holder: back.holder ?? '' } });
    }
  };
  const byId = [...session.pending.entries()].sort((a, b) => (BigInt(a[0]) < BigInt(b[0]) ? -1 : 1));
  const releases = new Map<string, string[]>();
  for (const [rid, p] of byId) {
    if (p.kind !== 'release') continue;
    const s = slot(p.holder, p.key);
    const list = releases.get(s);
    if (list) list.push(rid);
    else releases.set(s, [rid]);
  }
  for (const [s, locks] of [...session.held]) {
    const back = granted.get(s);
    granted.delete(s);
    const loseAll = (why: string) => {
      for (const lock of locks) lock._markLost(why);
      session.held.delete(s);
    };
    if (!back || BigInt(back.fencingToken) !== locks[0].fencingToken) {
      loseAll(`lost while the sidecar was away: ${lost.get(s) || 'the resumed session did not list it'}`);
      if (back) giveBack(back, back.holdCount);
      continue;
    }
    const unanswered = releases.get(s) ?? [];
    const applied = Math.min(unanswered.length, Math.max(0, locks.length - back.holdCount));
    for (const rid of unanswered.slice(0, applied)) {
      const done = session.pending.get(rid)!;
      session.pending.delete(rid);
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
    if (!session.pending.has(rid)) continue;
    if (p.kind !== 'acquire' && session.held.has(slot(p.holder, p.key))) {
      out.push(p.request);
      continue;
    }
    session.pending.delete(rid);
    // (No acquire is pending here: acquires wait for the resume to end.)
    const why = p.kind === 'acquire' ? 'the session was resumed: ask again' : 'the lock was lost while the sidecar was away';
    p.settle(null, new Unavailable(why));
  }
  return out;
}
