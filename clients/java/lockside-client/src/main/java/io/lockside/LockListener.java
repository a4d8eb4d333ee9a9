package io.lockside;

import java.time.Duration;

/**
 * Told when a lock is granted, suspended, restored, lost or given back (see {@link LocksideLock}). Called
 * on one thread of the client's own, in the order things happened; keep it short.
 */
public interface LockListener {
    /**
     * The session's stream broke: stop using the resource until {@link #onRestored} (or
     * give up: {@link #onLost} follows if the lock does not come back).
     */
    default void onSuspended(LockEvent lock) {}

    /** The resumed session lists the lock with its fencing token: it is yours again. */
    default void onRestored(LockEvent lock) {}

    /** The lock is gone: stop using the resource now. */
    default void onLost(LockEvent lock, String reason) {}

    /**
     * A holder was granted the lock after waiting {@code waited} (its first hold: a
     * reentrant one is not told). For metrics; the lock is already in use when this runs.
     */
    default void onAcquired(LockEvent lock, Duration waited) {}

    /** A holder gave the lock back (its last hold) after holding it for {@code held}. */
    default void onReleased(LockEvent lock, Duration held) {}
}
