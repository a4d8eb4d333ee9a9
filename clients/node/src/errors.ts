// The errors this package throws, and how the core's errors become them (`fromNative`).
// Expected outcomes the sidecar answers on the stream (NotAcquired, Rejected, Lost) are
// errors here too: a caller awaits a lock or a throw. An error that stands for a gRPC
// status (a sidecar that cannot be reached, a stream that ended, a failed `describe()`
// or `watch()`) keeps that status as its ES2022 `cause`: an `Error` with `code` (a
// google.rpc.Code number) and `details`.

/** Base class of every error this package throws. */
export class LocksideError extends Error {
  /** The key the failed request was about, when there is one. */
  readonly key?: string;
  /** `options.cause`: the error this one was made from (ES2022 `Error` cause). */
  constructor(message: string, key?: string, options?: ErrorOptions) {
    super(message, options);
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

/** The names of the google.rpc codes, by number. */
const CODE_NAMES = [
  'OK', 'CANCELLED', 'UNKNOWN', 'INVALID_ARGUMENT', 'DEADLINE_EXCEEDED', 'NOT_FOUND', 'ALREADY_EXISTS',
  'PERMISSION_DENIED', 'RESOURCE_EXHAUSTED', 'FAILED_PRECONDITION', 'ABORTED', 'OUT_OF_RANGE',
  'UNIMPLEMENTED', 'INTERNAL', 'UNAVAILABLE', 'DATA_LOSS', 'UNAUTHENTICATED',
];

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
  constructor(key: string, code: number, details: string, options?: ErrorOptions) {
    const codeName = CODE_NAMES[code] ?? 'UNKNOWN_CODE';
    super(`request for ${shortKey(key)} rejected: ${codeName} (${code}): ${details}`, key, options);
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
  constructor(key: string, reason: string, fencingToken: bigint, options?: ErrorOptions) {
    super(`lock ${shortKey(key)} lost: ${reason}`, key, options);
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
  /** The gRPC status code of the stream or call, when there was one (14 UNAVAILABLE). */
  readonly code?: number;
  constructor(message: string, code?: number, options?: ErrorOptions) {
    super(message, undefined, options);
    this.code = code;
  }
}

/** The gRPC status an error stands for: its `cause`. */
class GrpcStatus extends Error {
  constructor(
    readonly code: number,
    readonly details: string,
  ) {
    super(`${CODE_NAMES[code] ?? code}: ${details}`);
    this.name = 'GrpcStatus';
  }
}

/** A key as error messages show it: quoted, and cut when long. */
export function shortKey(key: string): string {
  return key.length <= 80 ? JSON.stringify(key) : `${JSON.stringify(key.slice(0, 60))}... (${key.length} characters)`;
}

/** A core error, as the addon reports it (native/lib.rs, `failure`). */
export interface Failure {
  kind: 'unavailable' | 'no_sidecar' | 'not_acquired' | 'rejected' | 'lost' | 'settings';
  code: number;
  reason: string;
  message: string;
}

/** The core's error in `e`, or undefined when `e` is not one (a bug: rethrow it). */
export function failure(e: unknown): Failure | undefined {
  if (!(e instanceof Error) || !e.message.startsWith('LOCKSIDE\u001f')) return undefined;
  const [, kind, code, reason, ...message] = e.message.split('\u001f');
  return { kind: kind as Failure['kind'], code: Number(code), reason, message: message.join('\u001f') };
}

/**
 * The core's error in `e` as this package's: `what` names the call (`lock`,
 * `describe`, `watch`) and `key` its key. Rejected answers on the stream (`lock`,
 * `proclaim`) have no cause; everything that stands for a gRPC status has it.
 */
export function fromNative(e: unknown, what: string, key: string, fencingToken = 0n): Error {
  const f = failure(e);
  if (!f) return e as Error;
  const status = () => ({ cause: new GrpcStatus(f.code, f.message) });
  switch (f.kind) {
    case 'not_acquired':
      return new NotAcquired(key, f.reason as NotAcquiredReason);
    case 'rejected':
      return new Rejected(key, f.code, f.message, what === 'lock' || what === 'proclaim' ? undefined : status());
    case 'lost':
      return new LockLost(key, f.message || 'lost', fencingToken);
    case 'settings':
      return new LocksideError(f.message, key);
    case 'no_sidecar':
      return new Unavailable(`no sidecar at ${f.message}: ${f.reason}`, f.code, { cause: new GrpcStatus(f.code, f.reason) });
    default:
      return new Unavailable(what === 'lock' ? f.message : `${what} ${shortKey(key)}: ${f.message}`, f.code, status());
  }
}
