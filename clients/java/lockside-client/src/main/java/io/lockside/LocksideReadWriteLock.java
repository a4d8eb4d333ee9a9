package io.lockside;

import java.util.concurrent.locks.ReadWriteLock;

/**
 * A distributed {@link ReadWriteLock}: readers hold the key SHARED and coexist; a
 * writer holds it EXCLUSIVE. Per thread, like {@link LocksideLock}. A thread that holds
 * the write lock may take the read lock too (one more hold of its exclusive grant: the
 * key stays exclusive until the thread gives back every hold); a thread that holds only
 * the read lock cannot take the write lock ({@link LocksideRejectedException}, where
 * {@code ReentrantReadWriteLock} would deadlock).
 */
public final class LocksideReadWriteLock implements ReadWriteLock {
    private final LocksideLock read;
    private final LocksideLock write;

    LocksideReadWriteLock(Core core, String key, LockOptions options) {
        this.read = new LocksideLock(core, key, LockMode.SHARED, 0, options);
        this.write = new LocksideLock(core, key, LockMode.EXCLUSIVE, 0, options);
    }

    @Override
    public LocksideLock readLock() {
        return read;
    }

    @Override
    public LocksideLock writeLock() {
        return write;
    }
}
