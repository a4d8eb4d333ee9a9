package io.lockside.spring;

import io.lockside.LockOptions;
import io.lockside.LocksideClient;
import io.lockside.LocksideLock;
import java.time.Duration;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Condition;
import org.springframework.integration.support.locks.DistributedLock;

/**
 * The lock a {@link LocksideLockRegistry} obtains: a {@link LocksideLock} (per thread,
 * reentrant, renewed by the sidecar while the client's session lives) that also takes
 * Spring's TTL. The TTL is the Lockside TTL: how long the store keeps the lock if the
 * sidecar dies (1 s to the sidecar's maximum), not a limit on how long it may be held; a
 * reentrant acquire keeps the TTL of the first.
 */
public final class LocksideDistributedLock implements DistributedLock {
    private final LocksideClient client;
    private final String key;
    private final LocksideLock lock;

    LocksideDistributedLock(LocksideClient client, String key) {
        this.client = client;
        this.key = key;
        this.lock = client.lock(key);
    }

    private LocksideLock withTtl(Duration ttl) {
        return client.lock(key, LockOptions.defaults().ttl(ttl));
    }

    @Override
    public void lock() {
        lock.lock();
    }

    /** Locks with `ttl` as the lock's Lockside TTL. */
    @Override
    public void lock(Duration ttl) {
        withTtl(ttl).lock();
    }

    @Override
    public void lockInterruptibly() throws InterruptedException {
        lock.lockInterruptibly();
    }

    @Override
    public boolean tryLock() {
        return lock.tryLock();
    }

    @Override
    public boolean tryLock(long time, TimeUnit unit) throws InterruptedException {
        return lock.tryLock(time, unit);
    }

    /** Waits up to `waitTime`; locks with `ttl` as the lock's Lockside TTL. */
    @Override
    public boolean tryLock(Duration waitTime, Duration ttl) throws InterruptedException {
        return withTtl(ttl).tryLock(waitTime.toNanos(), TimeUnit.NANOSECONDS);
    }

    /**
     * @throws IllegalMonitorStateException the calling thread does not hold the lock
     * @throws io.lockside.LockLostException the lock was lost while held
     */
    @Override
    public void unlock() {
        lock.unlock();
    }

    @Override
    public Condition newCondition() {
        return lock.newCondition();
    }

    /** See {@link LocksideLock#fencingToken()}. */
    public long fencingToken() {
        return lock.fencingToken();
    }

    /** See {@link LocksideLock#isSuspended()}. */
    public boolean isSuspended() {
        return lock.isSuspended();
    }

    /** See {@link LocksideLock#lost()}. */
    public CompletableFuture<Void> lost() {
        return lock.lost();
    }

    /** See {@link LocksideLock#isHeldByCurrentThread()}. */
    public boolean isHeldByCurrentThread() {
        return lock.isHeldByCurrentThread();
    }

    public String key() {
        return key;
    }

    @Override
    public String toString() {
        return "LocksideDistributedLock[" + key + "]";
    }
}
