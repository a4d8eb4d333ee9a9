package io.lockside;

import io.grpc.Status;
import java.util.concurrent.TimeUnit;
import lockside.v1.Lockside;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Waiting for the sidecar's answer to a request, outside the client's monitor: how long
 * an answer may take, what becomes of a request its caller stops waiting for, and the
 * retries of a release the store could not apply. What the answer means for the lock is
 * {@link Core}'s to decide.
 */
final class Answers {
    private static final Logger LOG = LoggerFactory.getLogger("io.lockside");

    /**
     * How long past its own wait an answer may take before the client gives up on it:
     * the sidecar answers every request, so only a broken sidecar or network hits this.
     */
    static final long SLACK_NANOS = TimeUnit.SECONDS.toNanos(10);

    private final Core core;

    Answers(Core core) {
        this.core = core;
    }

    /**
     * An acquire's answer, waited for up to `waitNanos` (the wait the sidecar was asked
     * for) and the slack. Throws {@link Pending.Broken} when the stream ended first; a
     * caller interrupted, or left without an answer, abandons the request.
     */
    Lockside.LeaseResponse acquire(Pending p, long waitNanos, boolean interruptible) throws InterruptedException {
        Lockside.LeaseResponse r;
        try {
            r = p.await(waitNanos + SLACK_NANOS, interruptible);
        } catch (InterruptedException e) {
            abandon(p);
            throw e;
        }
        if (r == null) {
            abandon(p);
            throw new LocksideUnavailableException("the sidecar at " + core.address + " did not answer an acquire of "
                    + Keys.show(p.slot.key()) + " in time");
        }
        return r;
    }

    /** The caller stopped waiting for `p` (interrupted, or no answer in time). */
    private void abandon(Pending p) {
        synchronized (core.mu) {
            Session s = p.session;
            if (p.answer.isDone()) {
                Grant g = p.grant;
                if (g != null && !g.lost && core.grants.get(g.slot) == g) {
                    // Granted as the caller gave up: nobody will use it.
                    core.grants.remove(g.slot);
                    s.held.remove(g.slot);
                    if (s.state == Session.State.OPEN) {
                        s.giveBack(g.slot, 1);
                    }
                }
                return;
            }
            s.pending.remove(p.id);
            if (s.state == Session.State.OPEN) {
                // Cancels the wait; if the grant crossed it, gives the grant back.
                s.giveBack(p.slot, 1);
            }
        }
    }

    /**
     * Waits for the answer to a release, asking again (up to 5 times, with backoff) while
     * the store is unavailable; a refusal for any other reason is logged, and the lock
     * counts as given back either way.
     */
    void release(Pending p) {
        Slot slot = p.slot;
        for (int attempt = 1; ; attempt++) {
            Lockside.LeaseResponse r = await(p);
            if (r == null || r.getEventCase() != Lockside.LeaseResponse.EventCase.REJECTED) {
                return; // released; or the stream broke (the session gives it back or ends)
            }
            Lockside.Rejected rej = r.getRejected();
            if (rej.getCode() != Status.Code.UNAVAILABLE.value() || attempt == 5) {
                // FAILED_PRECONDITION: a Lost crossed the Release, the key is not held.
                if (rej.getCode() != Status.Code.FAILED_PRECONDITION.value()) {
                    LOG.warn("lockside: release of {} refused: {}", Keys.show(slot.key()),
                            rej.getMessage());
                }
                return;
            }
            // The store did not answer; no hold was given back, and asking again is safe.
            sleepUninterruptibly(TimeUnit.MILLISECONDS.toNanos(100L << attempt));
            synchronized (core.mu) {
                Session s = p.session;
                if (s.state != Session.State.OPEN) {
                    return;
                }
                p = s.release(slot);
            }
        }
    }

    /**
     * A release's or proclaim's answer, waited for uninterruptibly; null when none came
     * within 10 s of the session being open (a resume in between does not count).
     * Throws Broken when the session ended first (only for proclaims: a release whose
     * stream broke counts as done).
     */
    Lockside.LeaseResponse await(Pending p) {
        long slice = TimeUnit.MILLISECONDS.toNanos(200);
        long openWaited = 0;
        while (true) {
            Lockside.LeaseResponse r;
            try {
                r = p.await(slice, false);
            } catch (Pending.Broken b) {
                if (p.kind == Pending.Kind.RELEASE) {
                    return null;
                }
                throw b;
            } catch (InterruptedException e) {
                throw new AssertionError(e); // not interruptible
            }
            if (r != null) {
                return r;
            }
            synchronized (core.mu) {
                if (p.session.state == Session.State.OPEN) {
                    openWaited += slice;
                }
            }
            if (openWaited >= SLACK_NANOS) {
                LOG.warn("lockside: no answer from the sidecar at {} to a {} of {}", core.address,
                        p.kind, Keys.show(p.slot.key()));
                return null;
            }
        }
    }

    private static void sleepUninterruptibly(long nanos) {
        long until = System.nanoTime() + nanos;
        boolean interrupted = false;
        while (true) {
            long left = until - System.nanoTime();
            if (left <= 0) {
                break;
            }
            try {
                TimeUnit.NANOSECONDS.sleep(left);
            } catch (InterruptedException e) {
                interrupted = true;
            }
        }
        if (interrupted) {
            Thread.currentThread().interrupt();
        }
    }
}
