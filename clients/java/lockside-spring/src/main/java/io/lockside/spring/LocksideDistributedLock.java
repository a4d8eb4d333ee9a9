package io.lockside.spring;

import io.lockside.LockLostException;
import io.lockside.LockOptions;
import io.lockside.LocksideException;
import io.lockside.LocksideSemaphore;
import io.lockside.Permit;
import java.time.Duration;
import java.util.ConcurrentModificationException;
import java.util.Objects;
import java.util.Optional;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.ReentrantLock;
import org.springframework.integration.support.locks.DistributedLock;
import org.springframework.scheduling.TaskScheduler;

/**
 * The lock a {@link LocksideLockRegistry} obtains, built as Spring's registries build
 * theirs: a local {@link ReentrantLock} (per-thread reentrancy, the threads of the
 * process take turns) in front of one Lockside grant held by this lock object (every
 * other registry, process and pod is excluded by the sidecar).
 *
 * <p>Without a TTL the grant is held for as long as the client's session lives. With one
 * ({@link #lock(Duration)}, {@link #tryLock(Duration, Duration)}, or the registry's
 * {@code expireAfter}) it is a lease: released in the store when it runs out unless
 * renewed ({@link LocksideLockRegistry#renewLock}); a reentrant acquire starts the lease
 * again, and one after the lease ran out takes the lock in the store again.
 */
public final class LocksideDistributedLock implements DistributedLock {
    /** The store TTL under a lease: at least the contract's 1 s, at most the default 10 s. */
    private static final Duration MIN_STORE_TTL = Duration.ofSeconds(1);
    private static final Duration MAX_STORE_TTL = Duration.ofSeconds(10);
    private static final Duration FOREVER = Duration.ofDays(36_500);
    static final String EXPIRED = "Lock was released in the store due to expiration. "
            + "The integrity of data protected by this lock may have been compromised.";

    private final LocksideLockRegistry registry;
    private final String key;
    private final ReentrantLock local = new ReentrantLock();
    private volatile long lockedAt = System.currentTimeMillis();

    // Guarded by this object's monitor.
    private Permit permit;
    private boolean expired;
    private Duration lease;
    private ScheduledFuture<?> expiry;
    private ScheduledFuture<?> renewal;

    LocksideDistributedLock(LocksideLockRegistry registry, String key) {
        this.registry = registry;
        this.key = key;
    }

    /** Locks, waiting as long as it takes; with the registry's {@code expireAfter} as lease, if any. */
    @Override
    public void lock() {
        lockWith(registry.getExpireAfter());
    }

    /** Locks, waiting as long as it takes, with `ttl` as the lease. */
    @Override
    public void lock(Duration ttl) {
        lockWith(lease(ttl));
    }

    private void lockWith(Duration lease) {
        local.lock();
        boolean ok = false;
        try {
            ok = takeUninterruptibly(lease);
        } finally {
            if (!ok) {
                giveUpLocal();
            }
        }
    }

    private boolean lockLocally() throws InterruptedException {
        local.lockInterruptibly();
        return true;
    }

    @Override
    public void lockInterruptibly() throws InterruptedException {
        local.lockInterruptibly();
        boolean ok = false;
        try {
            ok = take(-1, registry.getExpireAfter());
        } finally {
            if (!ok) {
                giveUpLocal();
            }
        }
    }

    /** Takes the lock if it is free now (one round trip to the sidecar). */
    @Override
    public boolean tryLock() {
        if (!local.tryLock()) {
            return false;
        }
        boolean ok = false;
        try {
            ok = take(0, registry.getExpireAfter());
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        } finally {
            if (!ok) {
                giveUpLocal();
            }
        }
        return ok;
    }

    @Override
    public boolean tryLock(long time, TimeUnit unit) throws InterruptedException {
        return tryLockWith(Duration.ofNanos(Math.max(0, unit.toNanos(time))), registry.getExpireAfter());
    }

    /** Waits up to `waitTime`; the lock is then held with `ttl` as the lease. */
    @Override
    public boolean tryLock(Duration waitTime, Duration ttl) throws InterruptedException {
        return tryLockWith(waitTime, lease(ttl));
    }

    private boolean tryLockWith(Duration waitTime, Duration lease) throws InterruptedException {
        // A wait of a century or more (tryLock(Long.MAX_VALUE, ...)) is a wait forever.
        long wait = waitTime.compareTo(FOREVER) >= 0 ? -1 : Math.max(0, waitTime.toNanos());
        long deadline = System.nanoTime() + wait;
        if (!(wait < 0 ? lockLocally() : local.tryLock(wait, TimeUnit.NANOSECONDS))) {
            return false;
        }
        boolean ok = false;
        try {
            ok = take(wait < 0 ? -1 : Math.max(0, deadline - System.nanoTime()), lease);
        } finally {
            if (!ok) {
                giveUpLocal();
            }
        }
        return ok;
    }

    /**
     * Gives back one hold of the calling thread; the last one releases the lock in the
     * store.
     *
     * @throws IllegalStateException the calling thread does not hold the lock
     * @throws ConcurrentModificationException the lease ran out, or the lock was lost
     *     (e.g. a broken stream not resumed in time), while held: another holder may have
     *     had it meanwhile
     */
    @Override
    public void unlock() {
        if (!local.isHeldByCurrentThread()) {
            throw new IllegalStateException("You do not own lock at " + key);
        }
        if (local.getHoldCount() > 1) {
            local.unlock();
            return;
        }
        try {
            Permit p;
            boolean wasExpired;
            synchronized (this) {
                p = permit;
                wasExpired = expired;
                permit = null;
                expired = false;
                endLease();
            }
            if (p == null || wasExpired) {
                throw new ConcurrentModificationException(EXPIRED);
            }
            try {
                p.close();
            } catch (LockLostException e) {
                throw lost(e);
            }
        } finally {
            registry.inUse.remove(this);
            local.unlock();
        }
    }

    @Override
    public Condition newCondition() {
        throw new UnsupportedOperationException("Conditions are not supported");
    }

    /**
     * The fencing token of the grant: larger than every token issued before for the key.
     *
     * @throws IllegalStateException the calling thread does not hold the lock
     */
    public long fencingToken() {
        return held().fencingToken();
    }

    /** Whether the grant is suspended (see {@link io.lockside.LocksideLock#isSuspended()}). */
    public boolean isSuspended() {
        Permit p = current();
        return p != null && p.isSuspended();
    }

    /**
     * Completes when the grant is lost (not when its lease runs out).
     *
     * @throws IllegalStateException the calling thread does not hold the lock
     */
    public CompletableFuture<Void> lost() {
        return held().lost();
    }

    /** Whether the calling thread holds the lock, in the store too (its lease has not run out). */
    public boolean isHeldByCurrentThread() {
        if (!local.isHeldByCurrentThread()) {
            return false;
        }
        synchronized (this) {
            return valid();
        }
    }

    /** How many holds the calling thread has. */
    public int getHoldCount() {
        return local.getHoldCount();
    }

    /** Whether some thread of this process holds it (or is taking it). */
    public boolean isAcquiredInThisProcess() {
        return local.isLocked();
    }

    /** The key in the store (the registry's prefix and the key). */
    public String key() {
        return key;
    }

    long lockedAt() {
        return lockedAt;
    }

    // -- the grant in the store ------------------------------------------------------

    private boolean takeUninterruptibly(Duration lease) {
        boolean interrupted = false;
        try {
            while (true) {
                try {
                    return take(-1, lease);
                } catch (InterruptedException e) {
                    interrupted = true;
                }
            }
        } finally {
            if (interrupted) {
                Thread.currentThread().interrupt();
            }
        }
    }

    /**
     * With the local lock held: holds the grant (waiting up to `waitNanos`, -1 forever),
     * starting `lease` (null: none). True when held.
     */
    private boolean take(long waitNanos, Duration lease) throws InterruptedException {
        registry.inUse.add(this);
        Permit stale = null;
        synchronized (this) {
            if (valid()) {
                startLease(lease); // a reentrant acquire starts the lease again, as Spring's
                return true;
            }
            if (permit != null) {
                stale = permit;
                permit = null;
                expired = false;
                endLease();
            }
        }
        giveBackQuietly(stale);
        LocksideSemaphore grant = registry.client.semaphore(key, 1, LockOptions.defaults().ttl(storeTtl(lease)));
        Optional<Permit> p = waitNanos < 0
                ? Optional.of(grant.acquire())
                : waitNanos == 0 ? grant.tryAcquire() : grant.tryAcquire(Duration.ofNanos(waitNanos));
        if (p.isEmpty()) {
            return false;
        }
        synchronized (this) {
            permit = p.get();
            expired = false;
            lockedAt = System.currentTimeMillis();
            // From the grant's arrival: a lease from the ask would run out during a wait.
            startLease(lease);
        }
        return true;
    }

    /** Extends the lease to `ttl` from now (null: the lease it has; none: nothing to do). */
    void renew(Duration ttl) {
        synchronized (this) {
            if (!valid()) {
                throw new IllegalStateException("Could not renew mutex at " + key
                        + ": this registry does not hold it (never locked, unlocked, or its lease ran out)");
            }
            Duration l = ttl != null ? lease(ttl) : lease;
            if (l != null) {
                startLease(l);
            }
        }
    }

    /** Under the monitor: the grant is held and neither expired nor lost. */
    private boolean valid() {
        return permit != null && !expired && !permit.lost().isDone();
    }

    /** Under the monitor: (re)starts the lease now; null keeps the lease there is, if any. */
    private void startLease(Duration l) {
        startLease(l, System.nanoTime());
    }

    /** Under the monitor: (re)starts the lease from `fromNanos` (System.nanoTime). */
    private void startLease(Duration l, long fromNanos) {
        if (l == null) {
            return;
        }
        if (expiry != null) {
            expiry.cancel(false);
        }
        lease = l;
        Permit p = permit;
        long delay = Math.max(0, fromNanos + l.toNanos() - System.nanoTime());
        expiry = LocksideLockRegistry.TIMERS.schedule(() -> expire(p), delay, TimeUnit.NANOSECONDS);
        TaskScheduler scheduler = registry.renewalScheduler;
        if (scheduler != null && renewal == null) {
            renewal = scheduler.scheduleWithFixedDelay(this::renewQuietly, l.dividedBy(3));
        }
    }

    private void renewQuietly() {
        synchronized (this) {
            if (valid() && lease != null) {
                startLease(lease);
            }
        }
    }

    /** Under the monitor: no lease any more. */
    private void endLease() {
        if (expiry != null) {
            expiry.cancel(false);
            expiry = null;
        }
        if (renewal != null) {
            renewal.cancel(false);
            renewal = null;
        }
        lease = null;
    }

    /** The lease of `p` ran out: give the grant back in the store, as an expiring key would go. */
    private void expire(Permit p) {
        synchronized (this) {
            if (permit != p || expired) {
                return;
            }
            expired = true;
            if (renewal != null) {
                renewal.cancel(false);
                renewal = null;
            }
        }
        giveBackQuietly(p);
    }

    private static void giveBackQuietly(Permit p) {
        if (p == null) {
            return;
        }
        try {
            p.close();
        } catch (LocksideException e) {
            // Lost already, or no sidecar: the store lets it go either way.
        }
    }

    private void giveUpLocal() {
        if (local.getHoldCount() == 1) {
            registry.inUse.remove(this);
        }
        local.unlock();
    }

    private Permit current() {
        synchronized (this) {
            return permit;
        }
    }

    private Permit held() {
        if (!local.isHeldByCurrentThread()) {
            throw new IllegalStateException("You do not own lock at " + key);
        }
        synchronized (this) {
            if (permit == null || expired) {
                throw new ConcurrentModificationException(EXPIRED);
            }
            return permit;
        }
    }

    private ConcurrentModificationException lost(LockLostException e) {
        return new ConcurrentModificationException("Lock at " + key + " was lost in the store while held ("
                + e.getMessage() + "). The integrity of data protected by this lock may have been compromised.", e);
    }

    private static Duration lease(Duration ttl) {
        Objects.requireNonNull(ttl, "ttl");
        if (ttl.isNegative() || ttl.isZero()) {
            throw new IllegalArgumentException("a lock's ttl must be positive, got " + ttl);
        }
        return ttl;
    }

    private static Duration storeTtl(Duration lease) {
        if (lease == null) {
            return null;
        }
        return lease.compareTo(MIN_STORE_TTL) < 0 ? MIN_STORE_TTL
                : lease.compareTo(MAX_STORE_TTL) > 0 ? MAX_STORE_TTL : lease;
    }

    @Override
    public String toString() {
        return "LocksideDistributedLock[" + key + "]";
    }
}
