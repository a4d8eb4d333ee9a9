package io.lockside.spring;

import io.lockside.LocksideClient;
import java.util.Objects;
import org.springframework.integration.support.locks.LockRegistry;

/**
 * A Spring Integration {@link LockRegistry} on the Lockside sidecar: {@link #obtain}
 * gives a {@link LocksideDistributedLock}, held per thread like any
 * {@code java.util.concurrent.locks.Lock} (reentrant on one thread, exclusive across
 * threads, processes and pods; {@code unlock()} by another thread throws
 * {@link IllegalMonitorStateException}).
 *
 * <pre>{@code
 * @Bean(destroyMethod = "close")
 * LocksideClient locksideClient() {
 *     return LocksideClient.connect();
 * }
 *
 * @Bean
 * LockRegistry<LocksideDistributedLock> lockRegistry(LocksideClient client) {
 *     return new LocksideLockRegistry(client);
 * }
 * }</pre>
 *
 * <p>It is not a {@code RenewableLockRegistry}: the sidecar renews every lock for as long
 * as the client's session lives, and a held lock's TTL cannot be changed, so
 * {@code renewLock} would have nothing true to do. Nor an {@code ExpirableLockRegistry}:
 * lock objects hold no state (the client keeps each thread's holds), so there is no
 * cache of them to expire.
 */
public class LocksideLockRegistry implements LockRegistry<LocksideDistributedLock> {
    private final LocksideClient client;
    private final String keyPrefix;

    /** Locks named by their keys as given. */
    public LocksideLockRegistry(LocksideClient client) {
        this(client, "");
    }

    /**
     * Locks named {@code keyPrefix + key}: a registry of its own among the other users
     * of the store's namespace (as {@code RedisLockRegistry}'s registry key).
     */
    public LocksideLockRegistry(LocksideClient client, String keyPrefix) {
        this.client = Objects.requireNonNull(client, "client");
        this.keyPrefix = Objects.requireNonNull(keyPrefix, "keyPrefix");
    }

    /**
     * The lock of `lockKey` (a String). Every object obtained for one key is the same
     * lock, per thread.
     */
    @Override
    public LocksideDistributedLock obtain(Object lockKey) {
        if (!(lockKey instanceof String)) {
            throw new IllegalArgumentException("lock keys of a LocksideLockRegistry are Strings, not "
                    + (lockKey == null ? "null" : lockKey.getClass().getName()));
        }
        return new LocksideDistributedLock(client, keyPrefix + lockKey);
    }
}
