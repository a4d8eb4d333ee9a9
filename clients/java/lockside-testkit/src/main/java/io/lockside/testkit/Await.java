package io.lockside.testkit;

import java.time.Duration;
import java.util.function.BooleanSupplier;

/** Waiting for a condition that nothing announces (a store's state, a queue's length). */
public final class Await {
    private Await() {}

    /** Polls `condition` until it holds; throws AssertionError after `timeout`. */
    public static void until(String what, Duration timeout, BooleanSupplier condition) {
        long until = System.nanoTime() + timeout.toNanos();
        while (!condition.getAsBoolean()) {
            if (System.nanoTime() - until > 0) {
                throw new AssertionError("not within " + timeout.toMillis() + " ms: " + what);
            }
            try {
                Thread.sleep(5); // polling: nothing to be notified by
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new AssertionError("interrupted while waiting: " + what);
            }
        }
    }
}
