package io.lockside;

import java.util.LinkedHashSet;
import java.util.List;
import java.util.Objects;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.Lock;

/**
 * Several keys as one {@link Lock} ({@link LocksideClient#multiLock}): {@link #lock()}
 * takes every key at once, all or none, with one {@code AcquireAll}. While any key is
 * busy it waits holding none of them, so threads and processes asking for overlapping
 * sets in any order never deadlock (see docs/semantics.md, "Several keys at once");
 * with {@link LockOptions#fair(boolean)} it is not overtaken by later requests for any
 * of its keys.
 *
 * <pre>{@code
 * Lock both = client.multiLock("account/alice", "account/bob");
 * both.lock();
 * try {
 *     // move money from one to the other
 * } finally {
 *     both.unlock();
 * }
 * }</pre>
 *
 * <p>Held per thread, as {@link LocksideLock}: each key is that thread's grant of the key,
 * the same as {@code client.lock(key)} of that thread (reentrant: a thread that holds
 * some or all of the keys takes only the others, and must unlock as many times as it
 * locked), each with its own fencing token ({@link #fencingToken(String)}), and each
 * suspended, restored and lost on its own. Only a thread that holds every key may
 * {@link #unlock()} ({@link IllegalMonitorStateException} otherwise). Exclusive, with
 * the options' TTL and fairness for every key; no conditions.
 */
public final class LocksideMultiLock implements Lock {
    /** The sidecar's bounds on an AcquireAll. */
    static final int MAX_KEYS = 64;

    private final Core core;
    private final List<String> keys;
    private final MultiAcquire acquiring;

    LocksideMultiLock(Core core, List<String> keys, LockOptions options) {
        this.core = core;
        Objects.requireNonNull(options, "options");
        for (String k : keys) {
            Objects.requireNonNull(k, "key");
        }
        LinkedHashSet<String> distinct = new LinkedHashSet<>(keys);
        if (distinct.size() != keys.size()) {
            throw new IllegalArgumentException("the keys of a multiLock must be distinct: " + keys);
        }
        if (keys.size() < 2 || keys.size() > MAX_KEYS) {
            throw new IllegalArgumentException("a multiLock takes 2 to " + MAX_KEYS + " keys, not " + keys.size());
        }
        this.keys = List.copyOf(keys);
        this.acquiring = new MultiAcquire(core, this.keys, options);
    }

    /** Waits as long as it takes, ignoring interrupts (the interrupt status is kept). */
    @Override
    public void lock() {
        try {
            acquiring.acquire(Core.FOREVER, false);
        } catch (InterruptedException e) {
            throw new AssertionError("not interruptible", e);
        }
    }

    @Override
    public void lockInterruptibly() throws InterruptedException {
        if (Thread.interrupted()) {
            throw new InterruptedException();
        }
        acquiring.acquire(Core.FOREVER, true);
    }

    /** Takes every key if all are free now (one round trip); false otherwise, holding none. */
    @Override
    public boolean tryLock() {
        try {
            return acquiring.acquire(0, false);
        } catch (InterruptedException e) {
            throw new AssertionError("not interruptible", e);
        }
    }

    /** Waits up to `time` for every key (the sidecar counts it); false, holding none, when one stayed busy. */
    @Override
    public boolean tryLock(long time, TimeUnit unit) throws InterruptedException {
        if (Thread.interrupted()) {
            throw new InterruptedException();
        }
        return acquiring.acquire(Math.max(0, unit.toNanos(time)), true);
    }

    /**
     * Gives back one hold of every key; the last one releases it.
     *
     * @throws IllegalMonitorStateException the calling thread does not hold every key
     *     (nothing is given back then)
     * @throws LockLostException one of the keys was lost while held (every hold is given
     *     back; the others lost are suppressed exceptions of this one)
     */
    @Override
    public void unlock() {
        String holder = LocksideLock.currentHolder();
        synchronized (core.mu) {
            for (String k : keys) {
                Grant g = core.grants.get(new Slot(holder, k));
                if (g == null || g.holds(LockMode.EXCLUSIVE) == 0) {
                    throw new IllegalMonitorStateException("lock " + Keys.show(k) + " is not held by " + holder);
                }
            }
        }
        LockLostException lost = null;
        for (String k : keys) {
            try {
                core.release(new Slot(holder, k), LockMode.EXCLUSIVE);
            } catch (LockLostException e) {
                if (lost == null) {
                    lost = e;
                } else {
                    lost.addSuppressed(e);
                }
            }
        }
        if (lost != null) {
            throw lost;
        }
    }

    /** Not supported: a condition would need the sidecar to signal across processes. */
    @Override
    public Condition newCondition() {
        throw new UnsupportedOperationException("LocksideMultiLock has no conditions");
    }

    /** The keys, in the order given. */
    public List<String> keys() {
        return keys;
    }

    /**
     * The fencing token of the calling thread's grant of `key`: pass it with every write
     * to that key's resource.
     *
     * @throws IllegalMonitorStateException the calling thread does not hold `key`
     * @throws IllegalArgumentException `key` is not one of this lock's
     */
    public long fencingToken(String key) {
        if (!keys.contains(key)) {
            throw new IllegalArgumentException(Keys.show(key) + " is not one of " + keys);
        }
        return held(key).fencingToken;
    }

    /** The fencing tokens of the calling thread's grants, in the order of {@link #keys()}. */
    public long[] fencingTokens() {
        long[] tokens = new long[keys.size()];
        for (int i = 0; i < tokens.length; i++) {
            tokens[i] = held(keys.get(i)).fencingToken;
        }
        return tokens;
    }

    /**
     * Completes when the first of the calling thread's grants is lost: the work that
     * needs every key must stop.
     *
     * @throws IllegalMonitorStateException the calling thread does not hold every key
     */
    public CompletableFuture<Void> lost() {
        CompletableFuture<?>[] each = new CompletableFuture<?>[keys.size()];
        for (int i = 0; i < each.length; i++) {
            each[i] = held(keys.get(i)).lostFuture;
        }
        return CompletableFuture.anyOf(each).thenApply(x -> null);
    }

    /** Whether any of the calling thread's grants is suspended (see {@link LocksideLock}). */
    public boolean isSuspended() {
        String holder = LocksideLock.currentHolder();
        synchronized (core.mu) {
            for (String k : keys) {
                Grant g = core.grants.get(new Slot(holder, k));
                if (g != null && g.suspended) {
                    return true;
                }
            }
            return false;
        }
    }

    /** Whether the calling thread holds every key (and none was lost). */
    public boolean isHeldByCurrentThread() {
        return getHoldCount() > 0 && !anyLost();
    }

    /** How many times the calling thread holds every key (the fewest holds of any key). */
    public int getHoldCount() {
        String holder = LocksideLock.currentHolder();
        synchronized (core.mu) {
            int fewest = Integer.MAX_VALUE;
            for (String k : keys) {
                Grant g = core.grants.get(new Slot(holder, k));
                fewest = Math.min(fewest, g == null ? 0 : g.holds(LockMode.EXCLUSIVE));
            }
            return fewest;
        }
    }

    private boolean anyLost() {
        String holder = LocksideLock.currentHolder();
        synchronized (core.mu) {
            for (String k : keys) {
                Grant g = core.grants.get(new Slot(holder, k));
                if (g == null || g.lost) {
                    return true;
                }
            }
            return false;
        }
    }

    private Grant held(String key) {
        Grant g = core.grant(new Slot(LocksideLock.currentHolder(), key));
        if (g == null || g.holds(LockMode.EXCLUSIVE) == 0) {
            throw new IllegalMonitorStateException("lock " + Keys.show(key) + " is not held by "
                    + LocksideLock.currentHolder());
        }
        return g;
    }

    @Override
    public String toString() {
        return "LocksideMultiLock" + keys;
    }
}
