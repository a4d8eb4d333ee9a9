package io.lockside;

import java.time.Duration;
import java.util.concurrent.CompletableFuture;

/**
 * One holder's grant of one key, from the sidecar's {@code Granted} until the holder
 * gives it back. Fields without {@code volatile} are guarded by the client's monitor.
 *
 * <p>The sidecar holds the key once per grant; reentrant holds of a thread are counted
 * here ({@link #exclusiveHolds}, {@link #sharedHolds}), so that a nested {@code lock()}
 * costs no round trip and cannot be left waiting behind a broken stream.
 */
final class Grant {
    final Slot slot;
    final long fencingToken;
    final LockMode mode;
    final int limit;
    /** The TTL the lock was taken with: how long a broken session may be resumed. */
    final Duration ttl;

    /** When the grant arrived (System.nanoTime). */
    final long grantedNanos = System.nanoTime();

    /** The session that holds it. */
    Session session;
    int exclusiveHolds;
    int sharedHolds;
    /** While the session is resumed: when the store has surely let the lock go. */
    long deadlineNanos;

    volatile boolean suspended;
    volatile boolean lost;
    volatile String lostReason;
    /** Completes when the lock is lost (never when it is given back). */
    final CompletableFuture<Void> lostFuture = new CompletableFuture<>();

    Grant(Slot slot, long fencingToken, LockMode mode, int limit, Duration ttl, Session session) {
        this.slot = slot;
        this.fencingToken = fencingToken;
        this.mode = mode;
        this.limit = limit;
        this.ttl = ttl;
        this.session = session;
    }

    int holds() {
        return exclusiveHolds + sharedHolds;
    }

    void add(LockMode view) {
        if (view == LockMode.SHARED) {
            sharedHolds++;
        } else {
            exclusiveHolds++;
        }
    }

    int holds(LockMode view) {
        return view == LockMode.SHARED ? sharedHolds : exclusiveHolds;
    }

    void remove(LockMode view) {
        if (view == LockMode.SHARED) {
            sharedHolds--;
        } else {
            exclusiveHolds--;
        }
    }

    LockEvent event() {
        return new LockEvent(slot.key(), slot.holder(), fencingToken);
    }

    LockLostException lostException() {
        return new LockLostException(slot.key(), lostReason, fencingToken);
    }
}
