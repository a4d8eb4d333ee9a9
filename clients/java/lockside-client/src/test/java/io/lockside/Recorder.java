package io.lockside;

import static org.junit.jupiter.api.Assertions.fail;

import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;

/** A LockListener that tests await: "suspended KEY", "restored KEY", "lost KEY". */
final class Recorder implements LockListener {
    private final BlockingQueue<String> events = new LinkedBlockingQueue<>();
    volatile String lastLostReason;

    @Override
    public void onSuspended(LockEvent lock) {
        events.add("suspended " + lock.key());
    }

    @Override
    public void onRestored(LockEvent lock) {
        events.add("restored " + lock.key());
    }

    @Override
    public void onLost(LockEvent lock, String reason) {
        lastLostReason = reason;
        events.add("lost " + lock.key());
    }

    /** The next event, which must come within `millis`. */
    String next(long millis) throws InterruptedException {
        String e = events.poll(millis, TimeUnit.MILLISECONDS);
        if (e == null) {
            fail("no lock event within " + millis + " ms");
        }
        return e;
    }

    /** Nothing happened. */
    boolean quiet() {
        return events.isEmpty();
    }
}
