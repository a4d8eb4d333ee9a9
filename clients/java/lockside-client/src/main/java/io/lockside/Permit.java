package io.lockside;

import java.util.concurrent.CompletableFuture;

/**
 * One permit of a {@link LocksideSemaphore}: a holder of its own inside the session, so
 * any thread may give it back. {@link #close()} gives it back (once; later calls do
 * nothing).
 */
public final class Permit implements AutoCloseable {
    private final Core core;
    private final Grant grant;
    private boolean closed;

    Permit(Core core, Grant grant) {
        this.core = core;
        this.grant = grant;
    }

    /** The fencing token of this permit's grant (each permit has its own). */
    public long fencingToken() {
        return grant.fencingToken;
    }

    /** Completes when the permit is lost. */
    public CompletableFuture<Void> lost() {
        return grant.lostFuture.copy();
    }

    /** Whether the permit is suspended: stop using the resource (see {@link LocksideLock}). */
    public boolean isSuspended() {
        return grant.suspended;
    }

    public String key() {
        return grant.slot.key();
    }

    /**
     * Gives the permit back.
     *
     * @throws LockLostException the permit was lost while held
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
