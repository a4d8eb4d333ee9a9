package io.lockside.spring;

import io.lockside.LocksideClient;
import java.lang.ref.ReferenceQueue;
import java.lang.ref.WeakReference;
import java.time.Duration;
import java.util.HashMap;
import java.util.Map;
import java.util.Objects;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.ThreadFactory;
import org.springframework.integration.support.locks.ExpirableLockRegistry;
import org.springframework.integration.support.locks.RenewableLockRegistry;
import org.springframework.scheduling.TaskScheduler;

/**
 * A Spring Integration lock registry on the Lockside sidecar, with the contract of
 * Spring's own registries ({@code RedisLockRegistry}, {@code JdbcLockRegistry}):
 *
 * <ul>
 *   <li>{@link #obtain} returns the same {@link LocksideDistributedLock} for a key while
 *       it is in use (held, waited for, or referenced by the application); an unused
 *       one is left to the garbage collector, so the cache never grows without bound.
 *   <li>A lock is reentrant on its thread, excludes the other threads of the process
 *       and every other registry, process and pod on the same store.
 *   <li>{@code unlock()} by a thread that does not hold it throws {@link
 *       IllegalStateException} ("You do not own lock at ..."); {@code unlock()} of a
 *       lock whose lease ran out throws {@link java.util.ConcurrentModificationException}
 *       ("Lock was released in the store due to expiration ...").
 *   <li>A TTL given to {@code lock(ttl)} / {@code tryLock(wait, ttl)}, or the registry's
 *       {@code expireAfter}, is a <em>lease</em>, as in Spring's registries: the lock is
 *       released in the store when it runs out unless {@link #renewLock} (or a {@link
 *       #setRenewalTaskScheduler renewal scheduler}) extends it, and another registry
 *       may then take it. Leases go down to 100 ms (the Lockside TTL underneath stays
 *       between 1 s and 10 s: how long the store keeps a lock whose sidecar died).
 * </ul>
 *
 * <p><b>Without a TTL</b> (the default: no {@code expireAfter}), a lock is Lockside's: it
 * is held for as long as the client's session lives (the sidecar renews it), however long
 * the work takes, and released at once when the application dies. This differs from
 * {@code RedisLockRegistry} (60 s) and {@code JdbcLockRegistry} (10 s), whose locks
 * expire by default.
 *
 * <pre>{@code
 * LockRegistry<LocksideDistributedLock> registry = new LocksideLockRegistry(client, "my-app:");
 * registry.executeLocked("orders/42", () -> process(order));
 * }</pre>
 */
public class LocksideLockRegistry
        implements ExpirableLockRegistry<LocksideDistributedLock>, RenewableLockRegistry<LocksideDistributedLock> {
    /** Lease timers of every registry: one daemon thread, never on the lock path. */
    static final ScheduledThreadPoolExecutor TIMERS = timers();

    final LocksideClient client;
    private final String keyPrefix;
    private final Duration expireAfter;
    private final Map<String, Ref> cache = new HashMap<>();
    private final ReferenceQueue<LocksideDistributedLock> collected = new ReferenceQueue<>();
    /** Locks held or waited for by some thread: kept from the garbage collector. */
    final Set<LocksideDistributedLock> inUse = ConcurrentHashMap.newKeySet();
    volatile TaskScheduler renewalScheduler;

    /** Locks named by their keys as given, held while the session lives (no lease). */
    public LocksideLockRegistry(LocksideClient client) {
        this(client, "");
    }

    /**
     * Locks named {@code keyPrefix + key}: a registry of its own among the other users
     * of the store's namespace (as {@code RedisLockRegistry}'s registry key).
     */
    public LocksideLockRegistry(LocksideClient client, String keyPrefix) {
        this(client, keyPrefix, null);
    }

    /**
     * As {@link #LocksideLockRegistry(LocksideClient, String)}, with {@code expireAfter}
     * as the lease of every lock taken without a TTL of its own ({@code lock()}, {@code
     * tryLock(...)}), as Spring's registries have it: the lock is released in the store
     * when the lease runs out unless renewed. Null: no lease (held while the session
     * lives).
     */
    public LocksideLockRegistry(LocksideClient client, String keyPrefix, Duration expireAfter) {
        this.client = Objects.requireNonNull(client, "client");
        this.keyPrefix = Objects.requireNonNull(keyPrefix, "keyPrefix");
        if (expireAfter != null && (expireAfter.isNegative() || expireAfter.isZero())) {
            throw new IllegalArgumentException("expireAfter must be positive, got " + expireAfter);
        }
        this.expireAfter = expireAfter;
    }

    /** The lease of locks taken without a TTL; null when they are held while the session lives. */
    public Duration getExpireAfter() {
        return expireAfter;
    }

    /**
     * The lock of {@code lockKey} (a String): the same object for a key while it is in use.
     */
    @Override
    public LocksideDistributedLock obtain(Object lockKey) {
        String key = keyOf(lockKey);
        synchronized (cache) {
            purge();
            Ref ref = cache.get(key);
            LocksideDistributedLock lock = ref == null ? null : ref.get();
            if (lock == null) {
                lock = new LocksideDistributedLock(this, keyPrefix + key);
                cache.put(key, new Ref(key, lock, collected));
            }
            return lock;
        }
    }

    /**
     * Forgets the locks that no thread holds or waits for and that were last locked
     * {@code age} ms ago or more (a later {@link #obtain} makes a new object). Locks are
     * forgotten by the garbage collector anyway once nothing refers to them.
     */
    @Override
    public void expireUnusedOlderThan(long age) {
        long now = System.currentTimeMillis();
        synchronized (cache) {
            purge();
            cache.values().removeIf(ref -> {
                LocksideDistributedLock lock = ref.get();
                return lock == null || (!lock.isAcquiredInThisProcess() && now - lock.lockedAt() >= age);
            });
        }
    }

    /** How many locks the registry knows now (for tests and metrics). */
    public int cachedLocks() {
        synchronized (cache) {
            purge();
            cache.values().removeIf(ref -> ref.get() == null);
            return cache.size();
        }
    }

    /**
     * Extends the lease of {@code lockKey} by the registry's {@code expireAfter}, else by
     * the lease the lock was taken with; a lock without a lease needs no renewal.
     *
     * @throws IllegalStateException this registry does not hold the lock (never took it,
     *     released it, or its lease ran out)
     */
    @Override
    public void renewLock(Object lockKey) {
        obtain(lockKey).renew(expireAfter);
    }

    /**
     * Extends the lease of {@code lockKey} to {@code ttl} from now (a lock held without a
     * lease becomes one).
     *
     * @throws IllegalStateException this registry does not hold the lock
     */
    @Override
    public void renewLock(Object lockKey, Duration ttl) {
        Objects.requireNonNull(ttl, "ttl");
        obtain(lockKey).renew(ttl);
    }

    /**
     * Renews every lease of this registry at a third of its length until it is unlocked,
     * on {@code scheduler}, as Spring's registries do.
     */
    @Override
    public void setRenewalTaskScheduler(TaskScheduler scheduler) {
        this.renewalScheduler = Objects.requireNonNull(scheduler, "scheduler");
    }

    private static String keyOf(Object lockKey) {
        if (!(lockKey instanceof String)) {
            throw new IllegalArgumentException("lock keys of a LocksideLockRegistry are Strings, not "
                    + (lockKey == null ? "null" : lockKey.getClass().getName()));
        }
        return (String) lockKey;
    }

    /** Drops the entries of locks the garbage collector took (under the cache's monitor). */
    private void purge() {
        for (Ref r; (r = (Ref) collected.poll()) != null; ) {
            if (cache.get(r.key) == r) {
                cache.remove(r.key);
            }
        }
    }

    @Override
    public String toString() {
        return "LocksideLockRegistry{keyPrefix=" + keyPrefix + ", expireAfter=" + expireAfter + "}";
    }

    private static ScheduledThreadPoolExecutor timers() {
        ThreadFactory daemon = r -> {
            Thread t = new Thread(r, "lockside-spring-leases");
            t.setDaemon(true);
            return t;
        };
        ScheduledThreadPoolExecutor t = new ScheduledThreadPoolExecutor(1, daemon);
        t.setRemoveOnCancelPolicy(true);
        return t;
    }

    private static final class Ref extends WeakReference<LocksideDistributedLock> {
        final String key;

        Ref(String key, LocksideDistributedLock lock, ReferenceQueue<LocksideDistributedLock> queue) {
            super(lock, queue);
            this.key = key;
        }
    }
}
