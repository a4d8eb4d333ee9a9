package io.lockside.testkit;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * Threads released together that pass through a guarded section again and again, and
 * how many of them were inside it at once, at the most: what a lock, a semaphore or a
 * scheduler lock is for. The test says how one pass takes and gives back what guards
 * the section ({@link Pass}).
 */
public final class Contention {
    private Contention() {}

    /** The section: counted, then a little work to widen any window of overlap. */
    @FunctionalInterface
    public interface Section {
        void run() throws InterruptedException;
    }

    /** One pass of a thread: take the guard, run `inside`, give the guard back (or skip when not taken). */
    @FunctionalInterface
    public interface Pass {
        void run(Section inside) throws Exception;
    }

    /**
     * Runs `threads` threads, each making `rounds` passes; inside, a thread works for
     * `workMillis`. Returns the most threads inside at once; throws what a thread threw,
     * or a TimeoutException when they take over 60 s.
     */
    public static int mostInside(int threads, int rounds, long workMillis, Pass pass) throws Exception {
        AtomicInteger inside = new AtomicInteger();
        AtomicInteger most = new AtomicInteger();
        Section section = () -> {
            most.accumulateAndGet(inside.incrementAndGet(), Math::max);
            Thread.sleep(workMillis);
            inside.decrementAndGet();
        };
        ExecutorService pool = Executors.newFixedThreadPool(threads);
        try {
            CountDownLatch go = new CountDownLatch(1);
            List<Future<?>> done = new ArrayList<>();
            for (int t = 0; t < threads; t++) {
                done.add(pool.submit(() -> {
                    go.await();
                    for (int i = 0; i < rounds; i++) {
                        pass.run(section);
                    }
                    return null;
                }));
            }
            go.countDown();
            for (Future<?> f : done) {
                f.get(60, TimeUnit.SECONDS);
            }
            return most.get();
        } finally {
            pool.shutdownNow();
        }
    }
}
