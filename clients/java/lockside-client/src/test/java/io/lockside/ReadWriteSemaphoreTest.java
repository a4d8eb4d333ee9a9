package io.lockside;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.lockside.testkit.Contention;
import io.lockside.testkit.SidecarExtension;
import java.util.ArrayList;
import java.util.List;
import java.util.Optional;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.CyclicBarrier;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.RegisterExtension;

/** ReadWriteLock and the counting semaphore, with one client shared by threads. */
class ReadWriteSemaphoreTest {
    @RegisterExtension
    static final SidecarExtension<LocksideClient> sidecar = SidecarExtension.connecting(LocksideClient::connect);
    LocksideClient client;
    String key;
    ExecutorService pool;

    @BeforeEach
    void connect() {
        client = sidecar.client();
        key = "rw/" + sidecar.testName();
        pool = sidecar.pool();
    }

    @Test
    void readersOnFourThreadsHoldTogetherAndExcludeTheWriter() throws Exception {
        LocksideReadWriteLock rw = client.readWriteLock(key);
        int readers = 4;
        CyclicBarrier allIn = new CyclicBarrier(readers + 1);
        CountDownLatch leave = new CountDownLatch(1);
        List<Future<?>> done = new ArrayList<>();
        for (int i = 0; i < readers; i++) {
            done.add(pool.submit(() -> {
                rw.readLock().lock();
                try {
                    allIn.await(10, TimeUnit.SECONDS); // every reader inside at once
                    leave.await();
                } finally {
                    rw.readLock().unlock();
                }
                return null;
            }));
        }
        allIn.await(10, TimeUnit.SECONDS);
        Description d = client.describe(key);
        assertEquals(LockMode.SHARED, d.mode());
        assertEquals(readers, d.holders().size(), "one grant per reading thread");
        assertFalse(pool.submit(() -> rw.writeLock().tryLock()).get(), "the writer waits for the readers");
        leave.countDown();
        for (Future<?> f : done) {
            f.get(10, TimeUnit.SECONDS);
        }
        assertTrue(pool.submit(() -> {
            boolean got = rw.writeLock().tryLock(5, TimeUnit.SECONDS);
            rw.writeLock().unlock();
            return got;
        }).get());
    }

    @Test
    void aWriterExcludesReadersAndMayTakeTheReadLockButNotTheReverse() throws Exception {
        LocksideReadWriteLock rw = client.readWriteLock(key);
        rw.writeLock().lock();
        assertFalse(pool.submit(() -> rw.readLock().tryLock()).get(), "no reader while a writer holds it");
        // Write then read on one thread: one more hold of the exclusive grant.
        rw.readLock().lock();
        assertEquals(1, rw.readLock().getHoldCount());
        assertEquals(1, rw.writeLock().getHoldCount());
        rw.writeLock().unlock();
        assertThrows(IllegalMonitorStateException.class, rw.writeLock()::unlock, "the write hold is gone");
        assertFalse(pool.submit(() -> rw.readLock().tryLock()).get(), "exclusive until the last hold");
        rw.readLock().unlock();
        assertTrue(client.describe(key).holders().isEmpty());

        // Read then write: refused, where ReentrantReadWriteLock would deadlock.
        rw.readLock().lock();
        LocksideRejectedException e = assertThrows(LocksideRejectedException.class, rw.writeLock()::lock);
        assertEquals("FAILED_PRECONDITION", e.codeName());
        rw.readLock().unlock();
    }

    @Test
    void aSemaphoreOfTwoLetsTwoOfFourThreadsInAtOnceNeverThree() throws Exception {
        LocksideSemaphore sem = client.semaphore(key, 2);
        List<Long> tokens = java.util.Collections.synchronizedList(new ArrayList<>());
        int threads = 4;
        int rounds = 15;
        // 2 ms inside: long enough that permits overlap.
        int most = Contention.mostInside(threads, rounds, 2, inside -> {
            try (Permit p = sem.acquire()) {
                tokens.add(p.fencingToken());
                inside.run();
            }
        });
        assertEquals(2, most, "two at once, never three");
        assertEquals(threads * rounds, tokens.size());
        assertEquals(tokens.size(), tokens.stream().distinct().count(), "each permit has a token of its own");
    }

    @Test
    void permitsAreHoldersOfTheirOwnAndAFullSemaphoreSaysSo() throws Exception {
        LocksideSemaphore sem = client.semaphore(key, 2);
        Permit a = sem.acquire();
        Permit b = sem.tryAcquire().orElseThrow();
        assertNotEquals(a.fencingToken(), b.fencingToken());
        assertEquals(2, client.describe(key).holders().size());
        assertEquals(2, client.describe(key).limit());
        assertTrue(sem.tryAcquire().isEmpty(), "full");
        // Any thread may give a permit back.
        pool.submit(a::close).get();
        Optional<Permit> c = sem.tryAcquire(java.time.Duration.ofSeconds(5));
        assertTrue(c.isPresent());
        b.close();
        c.get().close();
        c.get().close(); // once only
        assertTrue(client.describe(key).holders().isEmpty());
    }

    @Test
    void aLockAndASemaphoreOfOneKeyDisagreeOnTheLimit() {
        LocksideSemaphore sem = client.semaphore(key, 3);
        try (Permit p = sem.tryAcquire().orElseThrow()) {
            assertEquals(3, client.describe(p.key()).limit());
            LocksideRejectedException e = assertThrows(LocksideRejectedException.class, () -> client.lock(key).tryLock());
            assertEquals(9, e.code());
        }
    }
}
