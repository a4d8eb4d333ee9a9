// The errors this package throws, and how a gRPC status becomes one of them
// (`callError`, `statusText`, `causedBy`). Expected outcomes the sidecar answers on the
// stream (NotAcquired, Rejected, Lost) are errors here too: a caller awaits a lock or a
// throw. An error made from a gRPC status (a failed call, a stream that ended) keeps
// that status as its `cause` (the grpc-js `ServiceError`: `code`, `details`,
// `metadata`), as an error made from another error keeps that one.
import * as grpc from '@grpc/grpc-js';

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
    const codeName = (grpc.status as unknown as Record<number, string>)[code] ?? 'UNKNOWN_CODE';
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
  /** The gRPC status code of the stream or call, when there was one. */
  readonly code?: number;
  constructor(message: string, code?: number, options?: ErrorOptions) {
    super(message, undefined, options);
    this.code = code;
  }
}

/** A key as error messages show it: quoted, and cut when long. */
export function shortKey(key: string): string {
  return key.length <= 80 ? JSON.stringify(key) : `${JSON.stringify(key.slice(0, 60))}... (${key.length} characters)`;
}

/** `{ cause }` for an error made from `err`, when there is one (no `cause` property
 * at all otherwise). */
export function causedBy(err: unknown): ErrorOptions | undefined {
  return err === undefined || err === null ? undefined : { cause: err };
}

/** A failed unary or server-streaming call as this package's error. */
export function callError(what: string, key: string, err: grpc.ServiceError | undefined): LocksideError {
  const code = err?.code;
  if (code === undefined || [grpc.status.UNAVAILABLE, grpc.status.DEADLINE_EXCEEDED, grpc.status.CANCELLED].includes(code)) {
    return new Unavailable(`${what} ${shortKey(key)}: ${err?.details ?? 'no answer'}`, code, causedBy(err));
  }
  return new Rejected(key, code, err!.details, causedBy(err));
}

/** A gRPC status as error messages and loss reasons show it: `CODE: details`. */
export function statusText(err: grpc.ServiceError): string {
  const details = String(err.details || err.message).replace(/\s*Resolution note:.*$/s, '');
  return `${grpc.status[err.code] ?? err.code}: ${details}`;
}
