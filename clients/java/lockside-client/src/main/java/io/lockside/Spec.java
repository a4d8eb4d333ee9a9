package io.lockside;

import java.time.Duration;

/** One acquire as the client asks it: who, what, and how. */
record Spec(Slot slot, LockMode mode, int limit, boolean fair, Duration ttl, byte[] value) {
    static Spec of(String holder, String key, LockMode mode, int limit, LockOptions options) {
        return new Spec(new Slot(holder, key), mode, limit, options.fair(), options.ttl(), options.valueUnsafe());
    }

    String key() {
        return slot.key();
    }

    String holder() {
        return slot.holder();
    }
}
