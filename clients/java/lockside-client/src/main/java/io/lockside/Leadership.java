package io.lockside;

import java.nio.charset.StandardCharsets;
import java.util.concurrent.CompletableFuture;

/**
 * Leadership of an election key, from {@link LocksideClient#campaign}: a fair exclusive
 * lock whose value names the leader for every follower ({@link LocksideClient#describe},
 * {@link LocksideClient#watch}). {@link #close()} resigns.
 */
public final class Leadership implements AutoCloseable {
    private final Core core;
    private final Grant grant;
    private boolean closed;

    Leadership(Core core, Grant grant) {
        this.core = core;
        this.grant = grant;
    }

    /** Replaces the leader's value (a new address, say) without giving up leadership. */
    public void proclaim(byte[] value) {
        core.proclaim(grant, value.clone());
    }

    /** {@link #proclaim(byte[])} in UTF-8. */
    public void proclaim(String value) {
        proclaim(value.getBytes(StandardCharsets.UTF_8));
    }

    /** The fencing token of this leadership: successive leaders have larger ones. */
    public long fencingToken() {
        return grant.fencingToken;
    }

    /** Completes when leadership is lost: stop acting as the leader. */
    public CompletableFuture<Void> lost() {
        return grant.lostFuture.copy();
    }

    /** Whether leadership is suspended: act as a follower until it is restored. */
    public boolean isSuspended() {
        return grant.suspended;
    }

    public String key() {
        return grant.slot.key();
    }

    /**
     * Resigns (once; later calls do nothing).
     *
     * @throws LockLostException leadership was lost before
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
