package io.lockside;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.lockside.testkit.Contention;
import io.lockside.testkit.Ports;
import io.lockside.testkit.Sidecar;
import io.lockside.testkit.SidecarExtension;
import java.time.Duration;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.locks.Lock;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.RegisterExtension;

/** java.util.concurrent.locks.Lock, as one client shared by threads holds it. */
class LockBasicsTest {
    @RegisterExtension
    static final SidecarExtension<LocksideClient> sidecar = SidecarExtension.connecting(LocksideClient::connect);
    LocksideClient client;
    String key;

    @BeforeEach
    void connect() {
        client = sidecar.client();
        key = "basics/" + sidecar.testName();
    }

    /** Runs `task` on a thread of its own and returns its result. */
    static <T> T onOtherThread(java.util.concurrent.Callable<T> task) throws Exception {
        ExecutorService ex = Executors.newSingleThreadExecutor();
        try {
            return ex.submit(task).get(30, TimeUnit.SECONDS);
        } finally {
            ex.shutdownNow();
        }
    }

    @Test
    void lockThenUnlockGivesIncreasingTokens() {
        LocksideLock lock = client.lock(key);
        long last = 0;
        for (int i = 0; i < 5; i++) {
            lock.lock();
            try {
                assertTrue(lock.isHeldByCurrentThread());
                assertTrue(lock.fencingToken() > last, "tokens increase");
                last = lock.fencingToken();
                assertFalse(lock.isSuspended());
            } finally {
                lock.unlock();
            }
            assertFalse(lock.isHeldByCurrentThread());
        }
        assertTrue(client.describe(key).holders().isEmpty());
    }

    @Test
    void oneThreadAtATimeAmongEightSharingOneClient() throws Exception {
        Lock lock = client.lock(key);
        AtomicInteger entries = new AtomicInteger();
        int threads = 8;
        int rounds = 25;
        int most = Contention.mostInside(threads, rounds, 1, inside -> {
            lock.lock();
            try {
                entries.incrementAndGet();
                inside.run();
            } finally {
                lock.unlock();
            }
        });
        assertEquals(1, most, "never two threads inside");
        assertEquals(threads * rounds, entries.get());
    }

    @Test
    void aThreadReentersItsOwnLockAndOthersWaitUntilTheLastUnlock() throws Exception {
        LocksideLock lock = client.lock(key);
        lock.lock();
        long token = lock.fencingToken();
        lock.lock();
        assertEquals(2, lock.getHoldCount());
        assertEquals(token, lock.fencingToken(), "a reentrant hold keeps the grant's token");
        Description d = client.describe(key);
        assertEquals(1, d.holders().size());
        assertEquals(LocksideLock.currentHolder(), d.holders().get(0).holder());
        lock.unlock();
        boolean other = onOtherThread(lock::tryLock);
        assertFalse(other, "still held after one of two unlocks");
        lock.unlock();
        assertTrue(onOtherThread(() -> {
            boolean got = lock.tryLock();
            lock.unlock();
            return got;
        }));
    }

    @Test
    void unlockByAThreadThatDoesNotHoldItThrows() throws Exception {
        LocksideLock lock = client.lock(key);
        assertThrows(IllegalMonitorStateException.class, lock::unlock, "never locked");
        lock.lock();
        Throwable thrown = onOtherThread(() -> {
            try {
                lock.unlock();
                return null;
            } catch (Throwable t) {
                return t;
            }
        });
        assertTrue(thrown instanceof IllegalMonitorStateException, "got " + thrown);
        assertTrue(lock.isHeldByCurrentThread(), "the owner still holds it");
        lock.unlock();
        assertThrows(IllegalMonitorStateException.class, lock::unlock, "one unlock too many");
    }

    @Test
    void tryLockGivesUpAfterRoughlyItsTimeoutWhileAnotherThreadHoldsIt() throws Exception {
        LocksideLock lock = client.lock(key);
        lock.lock();
        try {
            long[] elapsed = new long[1];
            boolean got = onOtherThread(() -> {
                long start = System.nanoTime();
                boolean g = lock.tryLock(400, TimeUnit.MILLISECONDS);
                elapsed[0] = (System.nanoTime() - start) / 1_000_000;
                return g;
            });
            assertFalse(got);
            assertTrue(elapsed[0] >= 380 && elapsed[0] < 1500, "gave up after " + elapsed[0] + " ms");
            long start = System.nanoTime();
            boolean other = onOtherThread(lock::tryLock);
            assertFalse(other);
            assertTrue((System.nanoTime() - start) / 1_000_000 < 1000, "tryLock() does not wait");
        } finally {
            lock.unlock();
        }
    }

    @Test
    void tryLockWithATimeoutGetsTheLockWhenItIsReleasedMeanwhile() throws Exception {
        LocksideLock lock = client.lock(key);
        lock.lock();
        CountDownLatch waiting = new CountDownLatch(1);
        CompletableFuture<Long> waiter = CompletableFuture.supplyAsync(() -> {
            waiting.countDown();
            try {
                long start = System.nanoTime();
                boolean got = lock.tryLock(20, TimeUnit.SECONDS);
                long ms = (System.nanoTime() - start) / 1_000_000;
                if (got) {
                    lock.unlock();
                }
                return got ? ms : -1L;
            } catch (InterruptedException e) {
                throw new IllegalStateException(e);
            }
        });
        waiting.await();
        // The waiter is queued once Describe counts it.
        while (client.describe(key).waiters() == 0) {
            Thread.onSpinWait();
        }
        lock.unlock();
        long ms = waiter.get(30, TimeUnit.SECONDS);
        assertTrue(ms >= 0 && ms < 10_000, "granted when released, after " + ms + " ms");
    }

    @Test
    void anotherClientIsExcludedAndGetsTheLockWhenTheFirstClosesItsClient() throws Exception {
        try (LocksideClient other = LocksideClient.connect(sidecar.address())) {
            LocksideLock mine = client.lock(key);
            LocksideLock theirs = other.lock(key);
            mine.lock();
            assertFalse(theirs.tryLock());
            client.close(); // ends the session: the sidecar releases at once
            assertTrue(theirs.tryLock(5, TimeUnit.SECONDS));
            assertTrue(theirs.fencingToken() > 0);
            theirs.unlock();
        }
    }

    @Test
    void lockInterruptiblyStopsWaitingWhenInterruptedAndLeavesNothingBehind() throws Exception {
        LocksideLock lock = client.lock(key);
        lock.lock();
        CompletableFuture<Throwable> result = new CompletableFuture<>();
        Thread waiter = new Thread(() -> {
            try {
                lock.lockInterruptibly();
                result.complete(null);
            } catch (Throwable t) {
                result.complete(t);
            }
        });
        waiter.start();
        while (client.describe(key).waiters() == 0) {
            Thread.onSpinWait();
        }
        waiter.interrupt();
        assertTrue(result.get(10, TimeUnit.SECONDS) instanceof InterruptedException);
        // The cancelled wait is gone: releasing leaves the key free.
        lock.unlock();
        Description d = client.describe(key);
        assertTrue(d.holders().isEmpty(), "nobody holds it: " + d);
        assertEquals(0, d.waiters());
    }

    @Test
    void aRefusedKeyIsAnErrorAndTheSessionGoesOn() {
        LocksideRejectedException e = assertThrows(LocksideRejectedException.class, () -> client.lock("").lock());
        assertEquals("INVALID_ARGUMENT", e.codeName());
        LocksideLock lock = client.lock(key);
        assertTrue(lock.tryLock());
        lock.unlock();
    }

    @Test
    void newConditionIsUnsupported() {
        assertThrows(UnsupportedOperationException.class, () -> client.lock(key).newCondition());
    }

    @Test
    void connectFailsAtOnceNamingTheAddressWhenNothingListens() {
        String address = "127.0.0.1:" + Ports.free();
        long start = System.nanoTime();
        LocksideUnavailableException e =
                assertThrows(LocksideUnavailableException.class, () -> LocksideClient.connect(address));
        long ms = (System.nanoTime() - start) / 1_000_000;
        assertTrue(e.getMessage().contains(address), e.getMessage());
        assertTrue(e.getMessage().contains("connection refused"), e.getMessage());
        assertTrue(ms < 500, "failed after " + ms + " ms");
    }

    @Test
    void waitingForASidecarLogsOneLineAndTheErrorDoesNotAdviseWaiting() {
        String address = "127.0.0.1:" + Ports.free();
        java.io.PrintStream err = System.err;
        java.io.ByteArrayOutputStream log = new java.io.ByteArrayOutputStream();
        LocksideUnavailableException e;
        System.setErr(new java.io.PrintStream(log, true));
        try {
            e = assertThrows(LocksideUnavailableException.class, () -> LocksideClient.connect(
                    ClientOptions.defaults().address(address).waitForSidecar(Duration.ofMillis(700))));
        } finally {
            System.setErr(err);
        }
        String lines = log.toString();
        assertEquals(1, lines.lines().filter(l -> l.contains("waiting up to 0.7 s")).count(), lines);
        assertTrue(lines.contains(address), lines);
        assertTrue(e.getMessage().contains("after waiting 0.7 s"), e.getMessage());
        assertFalse(e.getMessage().contains("waitForSidecar"), "it waited already: " + e.getMessage());
    }

    @Test
    void tryLockWithTheLongestTimeoutWaitsAsLockDoes() throws Exception {
        LocksideLock lock = client.lock(key);
        assertTrue(lock.tryLock(Long.MAX_VALUE, TimeUnit.MILLISECONDS), "no overflow into a wait of no time");
        java.util.concurrent.Future<Boolean> other = sidecar.pool().submit(() -> {
            LocksideLock theirs = client.lock(key);
            boolean got = theirs.tryLock(Long.MAX_VALUE, TimeUnit.NANOSECONDS);
            theirs.unlock();
            return got;
        });
        assertThrows(java.util.concurrent.TimeoutException.class, () -> other.get(300, TimeUnit.MILLISECONDS));
        lock.unlock();
        assertTrue(other.get(10, TimeUnit.SECONDS));
    }

    @Test
    void aKeyNobodyHoldsIsDescribedWithModeUnspecified() {
        assertEquals(LockMode.UNSPECIFIED, client.describe(key).mode());
        LocksideLock lock = client.lock(key);
        lock.lock();
        assertEquals(LockMode.EXCLUSIVE, client.describe(key).mode());
        lock.unlock();
    }

    @Test
    void connectsOverAUnixSocket(@org.junit.jupiter.api.io.TempDir java.nio.file.Path dir) {
        try (Sidecar local = Sidecar.onUnixSocket(dir.resolve("lockside.sock"), "memory");
                LocksideClient c = LocksideClient.connect(local.address())) {
            LocksideLock lock = c.lock(key);
            assertTrue(lock.tryLock());
            assertEquals(lock.fencingToken(), c.describe(key).holders().get(0).fencingToken());
            lock.unlock();
        }
    }

    @Test
    void connectWaitsForASidecarThatStartsLaterWhenAskedTo() throws Exception {
        int port = Ports.free();
        CompletableFuture<LocksideClient> connecting = CompletableFuture.supplyAsync(() -> LocksideClient.connect(
                ClientOptions.defaults().address("127.0.0.1:" + port).waitForSidecar(Duration.ofSeconds(20))));
        try (Sidecar late = Sidecar.onPort(port, "memory");
                LocksideClient c = connecting.get(30, TimeUnit.SECONDS)) {
            LocksideLock lock = c.lock(key);
            assertTrue(lock.tryLock());
            lock.unlock();
            assertTrue(late.starts() == 1);
        }
    }
}
