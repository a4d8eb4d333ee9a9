// What the store says of one key, as `client.describe()` and `client.watch()` return it.
// Leader election reads it too: the leader is the holder of the oldest grant.
import type { NativeDescription } from './native.js';

/** The proto's `LockMode` names, by number. */
const MODES = ['UNSPECIFIED', 'EXCLUSIVE', 'SHARED'];
const mode = (n: number) => MODES[n] ?? 'UNSPECIFIED';

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

/** The sidecar's `DescribeResponse` as a `Description`. */
export function toDescription(res: NativeDescription): Description {
  const holders = res.holders.map((h) => ({
    sessionId: h.sessionId,
    holder: h.holder,
    holdCount: h.holdCount,
    ttlRemaining: h.ttlRemaining,
    clientName: h.clientName,
    value: Buffer.from(h.value),
    fencingToken: BigInt(h.fencingToken),
  }));
  let leader: Holder | undefined;
  for (const h of holders) if (!leader || h.fencingToken < leader.fencingToken) leader = h;
  return {
    key: res.key,
    mode: mode(res.mode),
    limit: res.limit,
    holders,
    waiters: res.waiters,
    fencingToken: BigInt(res.fencingToken),
    queue: res.queue.map((q) => ({ ...q, mode: mode(q.mode) })),
    leader,
  };
}
