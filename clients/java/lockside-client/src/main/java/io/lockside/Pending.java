package io.lockside;

import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import lockside.v1.Lockside;

/**
 * A request waiting for its answer. The caller blocks on {@link #answer} outside the
 * client's monitor; the stream's reader completes it under the monitor, with the answer,
 * or exceptionally with a {@link Broken} when the stream ends first.
 */
final class Pending {
    enum Kind {
        ACQUIRE,
        RELEASE,
        PROCLAIM
    }

    final long id;
    final Kind kind;
    final Slot slot;
    final Lockside.LeaseRequest request;
    final Session session;
    final CompletableFuture<Lockside.LeaseResponse> answer = new CompletableFuture<>();
    /** For an acquire: what it asks. */
    Spec spec;
    /** For an acquire granted: the grant the reader made of it (before completing). */
    Grant grant;
    /**
     * For an AcquireAll ({@link MultiAcquire}; null for one key): the grants the
     * reader made of its GrantedAll, in the order asked.
     */
    java.util.List<Grant> grants;

    Pending(long id, Kind kind, Slot slot, Lockside.LeaseRequest request, Session session) {
        this.id = id;
        this.kind = kind;
        this.slot = slot;
        this.request = request;
        this.session = session;
    }

    /**
     * The answer, or null when none came within `nanos`. Throws {@link Broken} when the
     * stream ended first.
     */
    Lockside.LeaseResponse await(long nanos, boolean interruptible) throws InterruptedException {
        boolean interrupted = false;
        long until = System.nanoTime() + nanos;
        try {
            while (true) {
                try {
                    return answer.get(Math.max(0, until - System.nanoTime()), TimeUnit.NANOSECONDS);
                } catch (InterruptedException e) {
                    if (interruptible) {
                        throw e;
                    }
                    interrupted = true;
                } catch (TimeoutException e) {
                    return null;
                } catch (ExecutionException e) {
                    if (e.getCause() instanceof Broken) {
                        throw (Broken) e.getCause();
                    }
                    throw new IllegalStateException(e.getCause());
                }
            }
        } finally {
            if (interrupted) {
                Thread.currentThread().interrupt();
            }
        }
    }

    /**
     * The stream ended before the answer came. `retry`: the session broke after it was
     * open (it is being resumed, or a new one can be opened), so a caller still willing
     * to wait may ask again; otherwise the sidecar could not be reached at all.
     */
    static final class Broken extends RuntimeException {
        private static final long serialVersionUID = 1L;
        final boolean retry;

        Broken(String message, boolean retry) {
            super(message, null, false, false);
            this.retry = retry;
        }

        LocksideUnavailableException unavailable() {
            return new LocksideUnavailableException(getMessage());
        }
    }
}
