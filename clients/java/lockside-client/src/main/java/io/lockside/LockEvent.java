package io.lockside;

/**
 * One grant a {@link LockListener} hears about: the key, the holder inside the session
 * ("thread-12" for a {@link LocksideLock} held by the thread of id 12, "permit-3",
 * "campaign-1"), and the grant's fencing token.
 */
public record LockEvent(String key, String holder, long fencingToken) {}
