package io.lockside.bench;

import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.Lock;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;

/**
 * Curator's InterProcessMutex (per-thread, reentrant, a sequential ephemeral node per
 * acquire) as a {@link Lock}, so the benchmark runs it as it runs the others.
 */
final class CuratorLock implements Lock {
    private final InterProcessMutex mutex;

    CuratorLock(CuratorFramework curator, String key) {
        this.mutex = new InterProcessMutex(curator, "/bench/" + key.replace('/', '-'));
    }

    @Override
    public void lock() {
        try {
            mutex.acquire();
        } catch (Exception e) {
            throw new IllegalStateException(e);
        }
    }

    @Override
    public void unlock() {
        try {
            mutex.release();
        } catch (Exception e) {
            throw new IllegalStateException(e);
        }
    }

    @Override
    public void lockInterruptibly() {
        lock();
    }

    @Override
    public boolean tryLock() {
        return tryLock(0, TimeUnit.MILLISECONDS);
    }

    @Override
    public boolean tryLock(long time, TimeUnit unit) {
        try {
            return mutex.acquire(time, unit);
        } catch (Exception e) {
            throw new IllegalStateException(e);
        }
    }

    @Override
    public Condition newCondition() {
        throw new UnsupportedOperationException();
    }
}
