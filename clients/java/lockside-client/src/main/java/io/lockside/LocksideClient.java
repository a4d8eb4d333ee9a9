package io.lockside;

import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Objects;
import java.util.Optional;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import lockside.v1.LockServiceGrpc;
import lockside.v1.Lockside;

/**
 * A connection to the Lockside sidecar: one session (one {@code Lease} stream) that every
 * lock of this client is held on. Share one client across the threads of a process;
 * each thread is a holder of its own, so a {@link LocksideLock} excludes threads as it
 * excludes processes. {@link #close()} ends the session, and the sidecar releases every
 * lock of it at once.
 *
 * <pre>{@code
 * try (LocksideClient client = LocksideClient.connect()) {   // $LOCKSIDE_ADDR or 127.0.0.1:7420
 *     Lock lock = client.lock("orders/42");
 *     lock.lock();
 *     try {
 *         // ... one thread, in one process, at a time
 *     } finally {
 *         lock.unlock();
 *     }
 * }
 * }</pre>
 */
public final class LocksideClient implements AutoCloseable {
    private static final AtomicLong CAMPAIGNS = new AtomicLong();

    private final Core core;

    private LocksideClient(Core core) {
        this.core = core;
    }

    /** Connects to {@code $LOCKSIDE_ADDR}, else 127.0.0.1:7420. */
    public static LocksideClient connect() {
        return connect(ClientOptions.defaults());
    }

    /** Connects to {@code host:port} (or {@code unix:/path}). */
    public static LocksideClient connect(String address) {
        return connect(ClientOptions.defaults().address(address));
    }

    /**
     * Connects and opens the session.
     *
     * @throws LocksideUnavailableException nothing listens at the address (at once,
     *     naming it, unless {@link ClientOptions#waitForSidecar} asks to wait), or the
     *     sidecar does not open a session in time
     */
    public static LocksideClient connect(ClientOptions options) {
        Probe.listening(options);
        Core core = new Core(options);
        try {
            core.start();
        } catch (RuntimeException e) {
            core.close();
            throw e;
        }
        return new LocksideClient(core);
    }

    /** An exclusive lock on `key`, held per thread, with the sidecar's default TTL. */
    public LocksideLock lock(String key) {
        return lock(key, LockOptions.defaults());
    }

    /** An exclusive lock on `key`, held per thread. */
    public LocksideLock lock(String key, LockOptions options) {
        return new LocksideLock(core, key, LockMode.EXCLUSIVE, 0, options);
    }

    /**
     * One lock of several keys (2 to 64, distinct), taken all at once or not at all,
     * without deadlock whatever order anyone names them in; exclusive, per thread, with
     * the sidecar's default TTL. {@link LocksideMultiLock#fencingToken(String)} gives each
     * key's fencing token.
     *
     * @throws IllegalArgumentException fewer than 2 keys, more than 64, or a duplicate
     */
    public LocksideMultiLock multiLock(String... keys) {
        return multiLock(java.util.Arrays.asList(keys), LockOptions.defaults());
    }

    /** {@link #multiLock(String...)} with a TTL and fairness for every key. */
    public LocksideMultiLock multiLock(java.util.List<String> keys, LockOptions options) {
        Objects.requireNonNull(keys, "keys");
        return new LocksideMultiLock(core, keys, options);
    }

    /** A read/write lock on `key` (readers SHARED, the writer EXCLUSIVE), per thread. */
    public LocksideReadWriteLock readWriteLock(String key) {
        return readWriteLock(key, LockOptions.defaults());
    }

    public LocksideReadWriteLock readWriteLock(String key, LockOptions options) {
        Objects.requireNonNull(key, "key");
        return new LocksideReadWriteLock(core, key, options);
    }

    /** A counting semaphore: at most `permits` holders of `key` at once. */
    public LocksideSemaphore semaphore(String key, int permits) {
        return semaphore(key, permits, LockOptions.defaults());
    }

    public LocksideSemaphore semaphore(String key, int permits, LockOptions options) {
        Objects.requireNonNull(key, "key");
        return new LocksideSemaphore(core, key, permits, options);
    }

    /**
     * Campaigns for leadership of `key` and waits until elected: a fair exclusive lock
     * whose value (`value`, typically this instance's address) followers read with
     * {@link #describe} or {@link #watch}.
     */
    public Leadership campaign(String key, String value) throws InterruptedException {
        return campaign(key, value, LockOptions.defaults());
    }

    public Leadership campaign(String key, String value, LockOptions options) throws InterruptedException {
        return new Leadership(core, core.acquire(campaignSpec(key, value, options), Core.FOREVER, true));
    }

    /** Campaigns for up to `wait`; empty when somebody else still leads then. */
    public Optional<Leadership> campaign(String key, String value, Duration wait) throws InterruptedException {
        Grant g = core.acquire(campaignSpec(key, value, LockOptions.defaults()), Math.max(0, wait.toNanos()), true);
        return g == null ? Optional.empty() : Optional.of(new Leadership(core, g));
    }

    private static Spec campaignSpec(String key, String value, LockOptions options) {
        Objects.requireNonNull(key, "key");
        LockOptions o = options.fair(true).value(value.getBytes(StandardCharsets.UTF_8));
        return Spec.of("campaign-" + CAMPAIGNS.incrementAndGet(), key, LockMode.EXCLUSIVE, 0, o);
    }

    /** The store's view of `key`: holders, waiters, the fair queue, the last fencing token. */
    public Description describe(String key) {
        Objects.requireNonNull(key, "key");
        Releasing.settled(key); // after this process's unanswered releases of the key
        Lockside.DescribeRequest request = Lockside.DescribeRequest.newBuilder().setKey(key).build();
        try {
            return Description.of(LockServiceGrpc.newBlockingStub(core.transport.channel)
                    .withDeadlineAfter(10, TimeUnit.SECONDS)
                    .describe(request));
        } catch (StatusRuntimeException e) {
            if (e.getStatus().getCode() != Status.Code.UNAVAILABLE) {
                throw Calls.error(key, e.getStatus(), core.address);
            }
        }
        // The channel's last connection failed (a sidecar restarting, say): connect
        // now, and give the call a moment to use the new connection.
        core.reconnectNow();
        try {
            return Description.of(LockServiceGrpc.newBlockingStub(core.transport.channel)
                    .withDeadlineAfter(2, TimeUnit.SECONDS)
                    .withWaitForReady()
                    .describe(request));
        } catch (StatusRuntimeException e) {
            throw Calls.error(key, e.getStatus(), core.address);
        }
    }

    /** Follows `key`: its current state, then each change (see {@link LockWatch}). */
    public LockWatch watch(String key) {
        Objects.requireNonNull(key, "key");
        Releasing.settled(key); // after this process's unanswered releases of the key
        core.reconnectNow();
        return new LockWatch(core.transport.stub, key, core.address);
    }

    /** The sidecar's address, as given. */
    public String address() {
        return core.address;
    }

    /** The current session's id, as {@link Description.Holder#sessionId()} shows it. */
    public String sessionId() {
        return core.sessionId();
    }

    /** Where the session is now: open, resuming (locks suspended), ended, closed. */
    public SessionState sessionState() {
        return core.state();
    }

    /** How many locks (grants of every holder) this client holds now. */
    public int heldLocks() {
        return core.heldAndSuspended()[0];
    }

    /** How many of the held locks are suspended now (the stream broke; see {@link LocksideLock}). */
    public int suspendedLocks() {
        return core.heldAndSuspended()[1];
    }

    /**
     * Ends the session: the sidecar releases every lock of it at once (locks still held
     * count as lost), and the connection closes.
     */
    @Override
    public void close() {
        core.close();
    }
}
