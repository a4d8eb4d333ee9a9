// A held lock: what `client.lock()` and `client.campaign()` resolve with, its options and
// its events. The core holds it (`NativeLock`) and says when its state changes; this
// turns that into the lock's properties, its `lost` Promise, its `AbortSignal` and its
// events.
import { EventEmitter } from 'node:events';
import { LockLost, LockSuspended, LocksideError, failure, fromNative, shortKey } from './errors.js';
import { checkSize, toValue } from './limits.js';
import { type NativeLock, type StateFollower, follow, unfollow } from './native.js';

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

/**
 * A held lock, from `client.lock()`. Use it while `held` is true: from the moment the
 * session's stream breaks it is *suspended* (`held` false, `suspended` true, `signal`
 * aborted, a `'suspended'` event), because a live sidecar releases a broken stream's
 * locks at once and a waiter elsewhere may hold it within milliseconds. It is then
 * either *restored* (`'restored'`: the resumed session listed it with the same fencing
 * token, nobody else held it in between) or *lost* (`'lost'`, `lost` resolves).
 */
export class Lock extends EventEmitter<LockEvents> implements StateFollower {
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

  private state: 'held' | 'suspended' | 'lost' | 'released' = 'held';
  private readonly native: NativeLock;
  private readonly id: number;
  private readonly resolveLost: (info: LostInfo) => void;
  /** Aborted when the lock is suspended or lost; a new one after each restore. */
  private controller = new AbortController();

  /** @internal */
  constructor(native: NativeLock) {
    super();
    this.native = native;
    this.id = native.id;
    this.key = native.key;
    this.holder = native.holder;
    this.fencingToken = BigInt(native.fencingToken);
    this.ttl = native.ttl;
    this.holdCount = native.holdCount;
    this.sessionId = native.sessionId;
    let resolve!: (info: LostInfo) => void;
    this.lost = new Promise<LostInfo>((r) => (resolve = r));
    this.resolveLost = resolve;
    follow(this.id, this);
    // (A change before this object existed: the core's news of it may come later.)
    this._changed(native.state(), native.reason());
  }

  /** True while the lock is held and may be used: false while it is suspended, and
   * for good once it is released or lost. */
  get held(): boolean {
    this.sync();
    return this.state === 'held';
  }

  /** True from the moment the session's stream broke until the lock is restored or
   * lost: do not use it meanwhile. */
  get suspended(): boolean {
    this.sync();
    return this.state === 'suspended';
  }

  /** Hand it to the work that uses the resource: aborted when the lock is suspended
   * (reason `LockSuspended`) or lost (`LockLost`). A restored lock has a new signal,
   * not aborted: read `lock.signal` again for work started after `'restored'`. */
  get signal(): AbortSignal {
    this.sync();
    return this.controller.signal;
  }

  /** Catches up with the core's state (its news may not have come yet). */
  private sync(): void {
    if (this.state === 'held' || this.state === 'suspended') this._changed(this.native.state(), this.native.reason());
  }

  /** @internal The core says the lock is now `to`. */
  _changed(to: string, reason: string): void {
    if (to === 'suspended' && this.state === 'held') {
      this.state = 'suspended';
      this.controller.abort(new LockSuspended(this.key, reason, this.fencingToken));
      this.tell('suspended', { key: this.key, reason, fencingToken: this.fencingToken });
    } else if (to === 'held' && this.state === 'suspended') {
      this.state = 'held';
      this.controller = new AbortController();
      this.tell('restored', { key: this.key, fencingToken: this.fencingToken, sessionId: this.sessionId });
    } else if (to === 'lost' && (this.state === 'held' || this.state === 'suspended')) {
      this.state = 'lost';
      this.lostReason = reason;
      unfollow(this.id);
      const info = { key: this.key, reason, fencingToken: this.fencingToken };
      this.resolveLost(info);
      // (A suspended lock's signal is aborted already: its reason then turns to LockLost
      // in a new signal.)
      if (this.controller.signal.aborted) this.controller = new AbortController();
      this.controller.abort(new LockLost(info.key, info.reason, info.fencingToken));
      this.tell('lost', info);
    }
  }

  /** @internal The client closed: what the core says now is final. */
  _closed(): void {
    this.sync();
  }

  /** Emits `event`. A listener that throws does so on its own tick (an uncaught
   * exception, as from any emitter), not inside the client's bookkeeping. */
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
   * Gives the lock back. Resolves once the `Release` is on the session's stream:
   * whatever this process asks of the key afterwards (another `lock()`, another
   * client's, a `describe()`) comes after it, and a loss the sidecar reports later is
   * logged. Resolves at once if already released; rejects with `LockLost` (once) if
   * the lock was lost before.
   */
  async release(): Promise<void> {
    if (this.state === 'released') return;
    this.sync();
    const lost = this.state === 'lost';
    this.state = 'released';
    unfollow(this.id);
    try {
      this.native.release();
    } catch (e) {
      if (failure(e)?.kind === 'lost' || lost) {
        throw new LockLost(this.key, this.lostReason ?? this.native.reason() ?? 'lost', this.fencingToken);
      }
      throw fromNative(e, 'release', this.key, this.fencingToken);
    }
  }

  /**
   * Replaces the lock's value (what `describe()` and `watch()` show of this holder): a
   * leader telling its followers where it now is, without giving up leadership. At
   * most 4 KiB. Rejects with `LockLost` if the lock is no longer held, `Rejected` for
   * a value too large or a store the sidecar cannot reach.
   */
  async proclaim(value: Uint8Array | string): Promise<void> {
    const bytes = toValue('value', value);
    checkSize(this.key, this.holder, bytes);
    this.sync();
    if (this.state === 'lost') throw new LockLost(this.key, this.lostReason ?? 'lost', this.fencingToken);
    if (this.state === 'released') throw new LocksideError(`lock ${shortKey(this.key)} was released`, this.key);
    try {
      await this.native.proclaim(bytes);
    } catch (e) {
      if (failure(e)?.kind === 'lost') {
        this.sync();
        throw new LockLost(this.key, this.lostReason ?? (this.native.reason() || 'lost'), this.fencingToken);
      }
      throw fromNative(e, 'proclaim', this.key, this.fencingToken);
    }
  }
}
