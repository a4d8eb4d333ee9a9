package io.lockside.shedlock;

import java.util.Optional;
import net.javacrumbs.shedlock.core.AbstractSimpleLock;
import net.javacrumbs.shedlock.core.LockConfiguration;
import net.javacrumbs.shedlock.core.SimpleLock;

/** A held ShedLock lock. ShedLock's base class refuses a second unlock or extend. */
final class LocksideSimpleLock extends AbstractSimpleLock {
    private final Held held;

    LocksideSimpleLock(LockConfiguration config, Held held) {
        super(config);
        this.held = held;
    }

    @Override
    protected void doUnlock() {
        held.unlock(lockConfiguration.getLockAtLeastUntil());
    }

    /**
     * New deadlines from now; empty when the lock is not held any more (its {@code
     * lockAtMostFor} passed, or it was lost). The Lockside TTL stays the one it was
     * taken with: the sidecar renews it all along.
     */
    @Override
    protected Optional<SimpleLock> doExtend(LockConfiguration newConfig) {
        synchronized (held) {
            if (!held.held()) {
                return Optional.empty();
            }
            held.holdAtMostUntil(newConfig.getLockAtMostUntil());
            return Optional.of(new LocksideSimpleLock(newConfig, held));
        }
    }
}
