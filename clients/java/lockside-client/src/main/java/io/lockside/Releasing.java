package io.lockside;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;

/**
 * Releases written and not answered yet, process-wide: what makes an {@code unlock()}
 * that returns without waiting for its answer invisible to the rest of the process (the
 * client core's rule, crates/lockside-client/src/releasing.rs).
 *
 * <p>{@code unlock()} returns once its Release is on the stream. Later requests of the
 * same holder on the same client are ordered after it by the sidecar (one holder's
 * requests on a key queue behind each other). Others are not: another thread's or
 * another client's lock of the key, here or through another sidecar, a describe or a
 * watch. Those wait here until the key's releases are answered (or
 * {@link Answers#SLACK_NANOS} has passed), so that within one process a key unlocked is
 * free, exactly as if {@code unlock()} had waited.
 */
final class Releasing {
    private Releasing() {}

    /** One release in flight: its key, its client and its holder. */
    static final class Entry {
        final String key;
        final Object client;
        final String holder;

        Entry(String key, Object client, String holder) {
            this.key = key;
            this.client = client;
            this.holder = holder;
        }
    }

    private static final Object MU = new Object();
    private static final Map<String, List<Entry>> IN_FLIGHT = new HashMap<>();

    /** A release of `key` by `holder` of `client` went out. */
    static Entry sent(String key, Object client, String holder) {
        Entry e = new Entry(key, client, holder);
        synchronized (MU) {
            IN_FLIGHT.computeIfAbsent(key, k -> new ArrayList<>()).add(e);
        }
        return e;
    }

    /** The release `e` was answered, or never will be. */
    static void done(Entry e) {
        synchronized (MU) {
            List<Entry> entries = IN_FLIGHT.get(e.key);
            if (entries != null && entries.remove(e)) {
                if (entries.isEmpty()) {
                    IN_FLIGHT.remove(e.key);
                }
                MU.notifyAll();
            }
        }
    }

    /**
     * Waits until no release of `key` is in flight that a request by `holder` of
     * `client` (null: a describe or a watch) would not be ordered after, for
     * {@link Answers#SLACK_NANOS} at most.
     */
    static void settled(String key, Object client, String holder, boolean interruptible)
            throws InterruptedException {
        long deadline = System.nanoTime() + Answers.SLACK_NANOS;
        boolean interrupted = false;
        try {
            synchronized (MU) {
                while (blocked(key, client, holder)) {
                    long left = deadline - System.nanoTime();
                    if (left <= 0) {
                        return;
                    }
                    try {
                        TimeUnit.NANOSECONDS.timedWait(MU, left);
                    } catch (InterruptedException ex) {
                        if (interruptible) {
                            throw ex;
                        }
                        interrupted = true;
                    }
                }
            }
        } finally {
            if (interrupted) {
                Thread.currentThread().interrupt();
            }
        }
    }

    /** {@link #settled} for calls that cannot be interrupted (describe, watch). */
    static void settled(String key) {
        try {
            settled(key, null, null, false);
        } catch (InterruptedException e) {
            throw new AssertionError(e); // not interruptible
        }
    }

    private static boolean blocked(String key, Object client, String holder) {
        List<Entry> entries = IN_FLIGHT.get(key);
        if (entries == null) {
            return false;
        }
        for (Entry e : entries) {
            if (client == null || e.client != client || !e.holder.equals(holder)) {
                return true;
            }
        }
        return false;
    }
}
