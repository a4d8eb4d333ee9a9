package io.lockside;

import java.util.Objects;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.Lock;

/**
 * A distributed lock held by the calling thread, as {@link Lock} promises: reentrant per
 * thread (a thread that holds it may lock it again and must unlock it as many times),
 * exclusive across threads of this client as across clients and processes, and only
 * the holding thread may unlock it ({@link IllegalMonitorStateException} otherwise).
 * Each thread is a holder of its own inside the client's session ("thread-" + its id).
 *
 * <p>A lock object holds no state of its own: every {@code LocksideLock} of one key on
 * one client is the same lock, per thread, and costs nothing to make.
 *
 * <p>While held, a lock can be <em>suspended</em> ({@link #isSuspended()}): the stream
 * to the sidecar broke, and until the session is resumed nobody can say whether the
 * sidecar released it. Stop using the resource at once. It is restored when the resumed
 * session lists it, with the same fencing token, or <em>lost</em> ({@link #lost()}
 * completes) when it does not, or the TTL passes first. {@link #unlock()} of a lost lock
 * throws {@link LockLostException}.
 *
 * <p>Errors the {@code Lock} methods cannot declare are unchecked: {@link
 * LocksideUnavailableException} (no sidecar), {@link LocksideRejectedException} (a bad
 * key or option, a conflicting mode or limit).
 */
public final class LocksideLock implements Lock {
    private final Core core;
    private final String key;
    private final LockMode mode;
    private final int limit;
    private final LockOptions options;

    LocksideLock(Core core, String key, LockMode mode, int limit, LockOptions options) {
        this.core = core;
        this.key = Objects.requireNonNull(key, "key");
        this.mode = mode;
        this.limit = limit;
        this.options = Objects.requireNonNull(options, "options");
    }

    /** The holder name of the calling thread inside the session. */
    static String currentHolder() {
        return "thread-" + Thread.currentThread().getId();
    }

    private Spec spec() {
        return Spec.of(currentHolder(), key, mode, limit, options);
    }

    private Slot slot() {
        return new Slot(currentHolder(), key);
    }

    /** Waits as long as it takes, ignoring interrupts (the interrupt status is kept). */
    @Override
    public void lock() {
        try {
            core.acquire(spec(), Core.FOREVER, false);
        } catch (InterruptedException e) {
            throw new AssertionError("not interruptible", e);
        }
    }

    @Override
    public void lockInterruptibly() throws InterruptedException {
        if (Thread.interrupted()) {
            throw new InterruptedException();
        }
        core.acquire(spec(), Core.FOREVER, true);
    }

    /**
     * Takes the lock if nobody else holds it, without waiting (one round trip to the
     * sidecar). False also while the session is being resumed.
     */
    @Override
    public boolean tryLock() {
        try {
            return core.acquire(spec(), 0, false) != null;
        } catch (InterruptedException e) {
            throw new AssertionError("not interruptible", e);
        }
    }

    /** Waits up to `time` for the lock (the sidecar counts it); false when it stayed busy. */
    @Override
    public boolean tryLock(long time, TimeUnit unit) throws InterruptedException {
        if (Thread.interrupted()) {
            throw new InterruptedException();
        }
        return core.acquire(spec(), Math.max(0, unit.toNanos(time)), true) != null;
    }

    /**
     * Gives back one hold of the calling thread; the last one releases the lock. It
     * returns once the Release is on the stream, without waiting for the answer: what
     * this process asks of the key afterwards (another thread's lock, another client's,
     * a describe or a watch) waits for that answer first, so it finds the key free as if
     * unlock had waited; a refusal that comes later is logged.
     *
     * @throws IllegalMonitorStateException the calling thread does not hold the lock
     * @throws LockLostException the lock was lost while held (the hold is given back)
     */
    @Override
    public void unlock() {
        core.release(slot(), mode);
    }

    /** Not supported: a condition would need the sidecar to signal across processes. */
    @Override
    public Condition newCondition() {
        throw new UnsupportedOperationException("LocksideLock has no conditions");
    }

    /**
     * The fencing token of the calling thread's grant: larger than every token issued
     * before for this key. Pass it to the resource you protect and have it refuse
     * writes with a lower token than the highest it has seen.
     *
     * @throws IllegalMonitorStateException the calling thread does not hold the lock
     */
    public long fencingToken() {
        return held().fencingToken;
    }

    /**
     * Completes when the calling thread's grant is lost (never when it is unlocked).
     *
     * @throws IllegalMonitorStateException the calling thread does not hold the lock
     */
    public CompletableFuture<Void> lost() {
        return held().lostFuture.copy();
    }

    /** Whether the calling thread's grant is suspended (see the class comment). */
    public boolean isSuspended() {
        Grant g = core.grant(slot());
        return g != null && g.suspended;
    }

    /** Whether the calling thread holds the lock (and it was not lost). */
    public boolean isHeldByCurrentThread() {
        Grant g = core.grant(slot());
        return g != null && !g.lost && g.holds(mode) > 0;
    }

    /** How many holds the calling thread has (0 when it does not hold the lock). */
    public int getHoldCount() {
        synchronized (core.mu) {
            Grant g = core.grants.get(slot());
            return g == null ? 0 : g.holds(mode);
        }
    }

    public String key() {
        return key;
    }

    private Grant held() {
        Grant g = core.grant(slot());
        if (g == null || g.holds(mode) == 0) {
            throw new IllegalMonitorStateException("lock " + Keys.show(key) + " is not held by " + currentHolder());
        }
        return g;
    }

    @Override
    public String toString() {
        return "LocksideLock[" + key + (mode == LockMode.SHARED ? ", read" : "") + "]";
    }
}
