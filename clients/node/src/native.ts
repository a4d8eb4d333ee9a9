// The addon (the client core, native/ in Rust): loaded once, and what it tells without
// being asked routed here: a lock's state changes to its `Lock`, the core's log lines
// (info and up: a session resumed, locks lost, a session that cannot be resumed) to
// the console, as `lockside: ...`.
import native from './addon.cjs';
import type { NativeClient, NativeDescription, NativeLock, NativeTls } from './addon.cjs';

export type { NativeClient, NativeDescription, NativeLock, NativeTls };
export const addon = native;

/** What a `Lock` does when the core says its state changed. */
export interface StateFollower {
  _changed(state: string, reason: string): void;
}

/** The locks that may still change, by the core's id for each. */
const followers = new Map<number, StateFollower>();

/** Locks held or suspended keep the process alive, as an open stream did: a timer
 * that never fires, while there is one. */
let keepAlive: NodeJS.Timeout | undefined;

export function follow(id: number, lock: StateFollower): void {
  followers.set(id, lock);
  keepAlive ??= setInterval(() => undefined, 2 ** 31 - 1);
}

export function unfollow(id: number): void {
  followers.delete(id);
  if (followers.size === 0 && keepAlive) {
    clearInterval(keepAlive);
    keepAlive = undefined;
  }
}

native.setListener(([kind, id, state, reason]) => {
  if (kind === 'state') {
    followers.get(id)?._changed(state, reason);
    return;
  }
  const line = `lockside: ${reason}`;
  if (state === 'error') console.error(line);
  else if (state === 'warn') console.warn(line);
  else console.info(line);
});
