package io.lockside;

import java.nio.charset.StandardCharsets;
import java.time.Duration;

/**
 * How a lock is asked for. Immutable: every setter returns a changed copy.
 *
 * <pre>{@code
 * client.lock("orders", LockOptions.defaults().ttl(Duration.ofSeconds(5)).fair(true));
 * }</pre>
 */
public final class LockOptions {
    private static final LockOptions DEFAULTS = new LockOptions(null, false, new byte[0]);

    private final Duration ttl;
    private final boolean fair;
    private final byte[] value;

    private LockOptions(Duration ttl, boolean fair, byte[] value) {
        this.ttl = ttl;
        this.fair = fair;
        this.value = value;
    }

    /** The sidecar's default TTL, unfair, no value. */
    public static LockOptions defaults() {
        return DEFAULTS;
    }

    /**
     * How long the store keeps the lock if the sidecar stops renewing it (the sidecar
     * died): 1 s to the sidecar's maximum (1 h unless configured). The sidecar renews
     * it every TTL/3 while the session lives. Null: the sidecar's default (10 s unless
     * configured). It is also how long a client whose stream broke tries to resume the
     * session before it counts the lock lost.
     */
    public LockOptions ttl(Duration ttl) {
        if (ttl != null && (ttl.isNegative() || ttl.isZero())) {
            throw new IllegalArgumentException("ttl must be positive");
        }
        return new LockOptions(ttl, fair, value);
    }

    /** Waiters are granted in arrival order across every sidecar of the store. */
    public LockOptions fair(boolean fair) {
        return new LockOptions(ttl, fair, value);
    }

    /**
     * The holder's value, shown by {@code describe} and {@code watch} for as long as the
     * grant lasts (at most 4096 bytes). Set by the first acquire of a holder; a reentrant
     * acquire keeps the value it has.
     */
    public LockOptions value(byte[] value) {
        return new LockOptions(ttl, fair, value == null ? new byte[0] : value.clone());
    }

    /** {@link #value(byte[])} in UTF-8. */
    public LockOptions value(String value) {
        return value(value == null ? null : value.getBytes(StandardCharsets.UTF_8));
    }

    /** The TTL asked for, or null for the sidecar's default. */
    public Duration ttl() {
        return ttl;
    }

    public boolean fair() {
        return fair;
    }

    public byte[] value() {
        return value.clone();
    }

    byte[] valueUnsafe() {
        return value;
    }
}
