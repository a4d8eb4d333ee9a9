package io.lockside;

import java.util.concurrent.CompletableFuture;

/**
 * A grant its own holder holds once inside the session (a {@link Permit}, a {@link
 * Leadership}), so that any thread may give it back, once.
 */
abstract sealed class HeldGrant implements AutoCloseable permits Leadership, Permit {
    final Core core;
    final Grant grant;
    private boolean closed;

    HeldGrant(Core core, Grant grant) {
        this.core = core;
        this.grant = grant;
    }

    /** The fencing token of this grant: each has its own, and later ones are larger. */
    public long fencingToken() {
        return grant.fencingToken;
    }

    /** Completes when the grant is lost: stop using the resource (a leader: stop leading). */
    public CompletableFuture<Void> lost() {
        return grant.lostFuture.copy();
    }

    /**
     * Whether the grant is suspended: stop using the resource until it is restored (a
     * leader: act as a follower); see {@link LocksideLock}.
     */
    public boolean isSuspended() {
        return grant.suspended;
    }

    public String key() {
        return grant.slot.key();
    }

    /**
     * Gives the grant back (once; later calls do nothing).
     *
     * @throws LockLostException the grant was lost while held
     */
    @Override
    public void close() {
        synchronized (this) {
            if (closed) {
                return;
            }
            closed = true;
        }
        core.releaseOnce(grant);
    }
}
