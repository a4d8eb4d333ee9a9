package io.lockside;

/**
 * Told when a held lock is suspended, restored or lost (see {@link LocksideLock}). Called
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
}
