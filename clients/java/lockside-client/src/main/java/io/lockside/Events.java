package io.lockside;

import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.RejectedExecutionException;
import java.util.function.Consumer;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The client's events thread: where the {@link LockListener} and the lost futures are
 * called, in order, and never under the client's monitor (a listener may call back into
 * the client).
 */
final class Events {
    private static final Logger LOG = LoggerFactory.getLogger("io.lockside");

    private final LockListener listener;
    private final ExecutorService thread = Executors.newSingleThreadExecutor(Transport.daemon("lockside-events"));

    Events(LockListener listener) {
        this.listener = listener;
    }

    /** Calls the listener, if any, on the events thread. */
    void fire(Consumer<LockListener> call) {
        LockListener l = listener;
        if (l == null) {
            return;
        }
        execute(() -> {
            try {
                call.accept(l);
            } catch (RuntimeException e) {
                LOG.warn("lockside: a LockListener threw", e);
            }
        });
    }

    /** Runs `task` on the events thread; after close, here and now. */
    void execute(Runnable task) {
        try {
            thread.execute(task);
        } catch (RejectedExecutionException e) {
            task.run();
        }
    }

    /** What was fired before runs; what is fired after runs at once, on the caller's thread. */
    void close() {
        thread.shutdown();
    }
}
