package io.lockside.shedlock;

import io.lockside.LockLostException;
import io.lockside.Permit;
import java.time.Duration;
import java.time.Instant;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import net.javacrumbs.shedlock.core.ClockProvider;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * One acquired ShedLock lock and its deadlines: released at {@code lockAtMostUntil}
 * whatever happens, and, once unlocked, not before {@code lockAtLeastUntil}. Shared by a
 * lock and the locks its {@code extend} makes.
 */
final class Held {
    private static final Logger LOG = LoggerFactory.getLogger("io.lockside.shedlock");

    private final Permit permit;
    private final ScheduledExecutorService timers;
    private ScheduledFuture<?> release;
    private boolean released;

    Held(Permit permit, ScheduledExecutorService timers) {
        this.permit = permit;
        this.timers = timers;
    }

    /** Whether the name is still held for this lock (not released, not lost). */
    synchronized boolean held() {
        return !released && !permit.lost().isDone();
    }

    /** Releases at `until` (or now if it has passed), replacing any earlier deadline. */
    synchronized void holdAtMostUntil(Instant until) {
        releaseAt(until);
    }

    /** Releases now, or at `lockAtLeastUntil` if that is later. */
    synchronized void unlock(Instant lockAtLeastUntil) {
        releaseAt(lockAtLeastUntil);
    }

    private void releaseAt(Instant when) {
        if (released) {
            return;
        }
        if (release != null) {
            release.cancel(false);
        }
        long delay = Duration.between(ClockProvider.now(), when).toNanos();
        if (delay <= 0) {
            releaseNow();
        } else {
            release = timers.schedule(this::releaseNow, delay, TimeUnit.NANOSECONDS);
        }
    }

    private synchronized void releaseNow() {
        if (released) {
            return;
        }
        released = true;
        try {
            permit.close();
        } catch (LockLostException e) {
            LOG.warn("lockside: ShedLock lock {} was lost while held: {}", permit.key(), e.reason());
        } catch (RuntimeException e) {
            LOG.warn("lockside: releasing ShedLock lock " + permit.key() + " failed", e);
        }
    }
}
