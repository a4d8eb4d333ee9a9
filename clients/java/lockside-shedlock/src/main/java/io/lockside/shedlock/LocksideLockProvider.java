package io.lockside.shedlock;

import io.lockside.LockOptions;
import io.lockside.LocksideClient;
import io.lockside.Permit;
import java.time.Duration;
import java.util.Objects;
import java.util.Optional;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import net.javacrumbs.shedlock.core.ExtensibleLockProvider;
import net.javacrumbs.shedlock.core.LockConfiguration;
import net.javacrumbs.shedlock.core.SimpleLock;

/**
 * A ShedLock {@code LockProvider} on the Lockside sidecar.
 *
 * <pre>{@code
 * @Bean
 * LockProvider lockProvider(LocksideClient client) {
 *     return new LocksideLockProvider(client);
 * }
 * }</pre>
 *
 * <p>ShedLock's rules, kept:
 * <ul>
 *   <li>{@code lock} does not wait: empty when the name is held anywhere.</li>
 *   <li>{@code lockAtMostFor} is a ceiling: the lock is released then even if the task
 *   still runs, and it is also the ceiling of the Lockside TTL (how long the store keeps
 *   the lock if the sidecar dies): the TTL is {@code lockAtMostFor}, at most 10 s and at
 *   least 1 s. If the app dies, the sidecar releases at once.</li>
 *   <li>{@code lockAtLeastFor}: an unlock before it keeps the name held until then.</li>
 *   <li>{@code extend} moves both deadlines ({@code ExtensibleLockProvider}).</li>
 * </ul>
 * Each lock is a holder of its own in the client's session, not the calling thread, so
 * the delayed releases may come from the provider's timer thread.
 */
public class LocksideLockProvider implements ExtensibleLockProvider {
    /** The longest TTL asked for: the sidecar's default. */
    static final Duration MAX_TTL = Duration.ofSeconds(10);
    /** The shortest TTL the sidecar accepts. */
    static final Duration MIN_TTL = Duration.ofSeconds(1);

    private final LocksideClient client;
    private final String keyPrefix;
    private final ScheduledExecutorService timers;

    /** Locks named by their ShedLock names as given. */
    public LocksideLockProvider(LocksideClient client) {
        this(client, "");
    }

    /** Locks named {@code keyPrefix + name}. */
    public LocksideLockProvider(LocksideClient client, String keyPrefix) {
        this.client = Objects.requireNonNull(client, "client");
        this.keyPrefix = Objects.requireNonNull(keyPrefix, "keyPrefix");
        ScheduledThreadPoolExecutor t = new ScheduledThreadPoolExecutor(1, r -> {
            Thread thread = new Thread(r, "lockside-shedlock");
            thread.setDaemon(true);
            return thread;
        });
        t.setRemoveOnCancelPolicy(true);
        this.timers = t;
    }

    @Override
    public Optional<SimpleLock> lock(LockConfiguration config) {
        LockOptions options = LockOptions.defaults().ttl(ttl(config.getLockAtMostFor()));
        // A semaphore of one permit is a lock owned by an object (its permit) rather
        // than by the calling thread: any thread may give it back.
        Optional<Permit> permit = client.semaphore(keyPrefix + config.getName(), 1, options).tryAcquire();
        return permit.map(p -> {
            Held held = new Held(p, timers);
            held.holdAtMostUntil(config.getLockAtMostUntil());
            return new LocksideSimpleLock(config, held);
        });
    }

    /** {@code lockAtMostFor} within the TTLs the sidecar takes, at most {@link #MAX_TTL}. */
    static Duration ttl(Duration lockAtMostFor) {
        Duration ttl = lockAtMostFor.compareTo(MAX_TTL) > 0 ? MAX_TTL : lockAtMostFor;
        return ttl.compareTo(MIN_TTL) < 0 ? MIN_TTL : ttl;
    }
}
