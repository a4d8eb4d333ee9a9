package io.lockside;

import java.time.Duration;
import java.util.Optional;
import java.util.concurrent.atomic.AtomicLong;

/**
 * A distributed counting semaphore: at most {@code permits} holders of the key at once,
 * across every client of the store. Each permit is a {@link Permit}, a holder of its own
 * (not the calling thread): one thread may take several, and any thread may give one
 * back.
 *
 * <pre>{@code
 * try (Permit p = semaphore.acquire()) {
 *     callTheRateLimitedService(p.fencingToken());
 * }
 * }</pre>
 */
public final class LocksideSemaphore {
    private static final AtomicLong PERMITS = new AtomicLong();

    private final Core core;
    private final String key;
    private final int permits;
    private final LockOptions options;

    LocksideSemaphore(Core core, String key, int permits, LockOptions options) {
        if (permits < 1) {
            throw new IllegalArgumentException("permits must be at least 1, got " + permits);
        }
        this.core = core;
        this.key = key;
        this.permits = permits;
        this.options = options;
    }

    private Spec spec() {
        return Spec.of("permit-" + PERMITS.incrementAndGet(), key, LockMode.EXCLUSIVE, permits, options);
    }

    /** Waits as long as it takes for a permit. */
    public Permit acquire() throws InterruptedException {
        return new Permit(core, core.acquire(spec(), Core.FOREVER, true));
    }

    /** A permit if one is free now. */
    public Optional<Permit> tryAcquire() {
        try {
            return wrap(core.acquire(spec(), 0, false));
        } catch (InterruptedException e) {
            throw new AssertionError("not interruptible", e);
        }
    }

    /** A permit if one frees up within `wait`. */
    public Optional<Permit> tryAcquire(Duration wait) throws InterruptedException {
        return wrap(core.acquire(spec(), Math.max(0, wait.toNanos()), true));
    }

    private Optional<Permit> wrap(Grant g) {
        return g == null ? Optional.empty() : Optional.of(new Permit(core, g));
    }

    public String key() {
        return key;
    }

    public int permits() {
        return permits;
    }
}
