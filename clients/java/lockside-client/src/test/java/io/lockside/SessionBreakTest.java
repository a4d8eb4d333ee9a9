package io.lockside;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.lockside.testkit.Await;
import io.lockside.testkit.RedisServer;
import io.lockside.testkit.Sidecar;
import java.time.Duration;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * DESIGN.md, "A broken stream": suspended at once, restored when the resumed session
 * lists the lock with its token, lost otherwise. Each test has its own sidecar to kill.
 */
class SessionBreakTest {
    RedisServer redis;
    Sidecar sidecar;
    final Recorder events = new Recorder();

    @BeforeEach
    void startRedis() {
        redis = RedisServer.start();
    }

    @AfterEach
    void stopAll() {
        if (sidecar != null) {
            sidecar.close();
        }
        redis.close();
    }

    private LocksideClient connect() {
        return LocksideClient.connect(ClientOptions.defaults().address(sidecar.address()).listener(events));
    }

    @Test
    void aSidecarKilledAndRestartedOnTheSameAddressGivesTheLockBackWithItsToken() throws Exception {
        // A short attachment TTL: the restarted sidecar may resume the dead one's
        // sessions soon after it died.
        sidecar = Sidecar.start(redis.url(), "--attachment-ttl", "600ms");
        // A waiter elsewhere, on another sidecar of the same store that stays up.
        try (Sidecar elsewhere = Sidecar.start(redis.url());
                LocksideClient client = connect();
                LocksideClient other = LocksideClient.connect(elsewhere.address())) {
            LocksideLock lock = client.lock("break/restart", LockOptions.defaults().ttl(Duration.ofSeconds(10)));
            lock.lock();
            long token = lock.fencingToken();
            LocksideLock theirs = other.lock("break/restart");
            CompletableFuture<Long> waiter = CompletableFuture.supplyAsync(() -> {
                theirs.lock();
                try {
                    return theirs.fencingToken();
                } finally {
                    theirs.unlock();
                }
            });
            Await.until("the waiter elsewhere is queued", Duration.ofSeconds(5),
                    () -> other.describe("break/restart").waiters() == 1);
            // Only what the sidecar's journal has written can be resumed.
            Await.until("the session record lists the lock", Duration.ofSeconds(5),
                    () -> redis.recorded(client.sessionId(), 1));

            sidecar.kill();
            assertEquals("suspended break/restart", events.next(5000));
            assertTrue(lock.isSuspended(), "suspended at once");
            assertTrue(lock.isHeldByCurrentThread(), "still this thread's, suspended");

            sidecar.restart();
            assertEquals("restored break/restart", events.next(10_000));
            assertFalse(lock.isSuspended());
            assertEquals(token, lock.fencingToken(), "the same grant");
            assertFalse(lock.lost().isDone());

            // Nobody else held it in between, and the waiter still waits until the unlock.
            assertFalse(waiter.isDone(), "the waiter elsewhere was not granted meanwhile");
            assertEquals(token, other.describe("break/restart").holders().get(0).fencingToken());
            lock.unlock();
            assertTrue(waiter.get(10, TimeUnit.SECONDS) > token);
        }
    }

    @Test
    void everyHolderOfTheSessionComesBackAndAWaitInProgressIsAskedAgain() throws Exception {
        sidecar = Sidecar.start(redis.url(), "--attachment-ttl", "600ms");
        ExecutorService pool = Executors.newCachedThreadPool();
        try (LocksideClient client = connect()) {
            LocksideLock a = client.lock("holders/a");
            LocksideLock b = client.lock("holders/b");
            LocksideSemaphore sem = client.semaphore("holders/sem", 2);
            a.lock(); // this thread
            long tokenA = a.fencingToken();
            long tokenB = pool.submit(() -> {
                b.lock(); // another thread: another holder, left holding
                return b.fencingToken();
            }).get();
            Permit permit = sem.acquire();
            // A third thread waits for this thread's lock.
            CompletableFuture<Long> waiter = CompletableFuture.supplyAsync(() -> {
                a.lock();
                try {
                    return a.fencingToken();
                } finally {
                    a.unlock();
                }
            }, pool);
            Await.until("the waiter is queued", Duration.ofSeconds(5), () -> client.describe("holders/a").waiters() == 1);
            Await.until("the session record lists three grants", Duration.ofSeconds(5),
                    () -> redis.recorded(client.sessionId(), 3));

            sidecar.kill();
            for (int i = 0; i < 3; i++) {
                assertTrue(events.next(5000).startsWith("suspended "));
            }
            assertTrue(a.isSuspended());
            assertTrue(permit.isSuspended());
            sidecar.restart();
            java.util.Set<String> restored = new java.util.HashSet<>();
            for (int i = 0; i < 3; i++) {
                restored.add(events.next(10_000));
            }
            assertEquals(java.util.Set.of("restored holders/a", "restored holders/b", "restored holders/sem"), restored);
            assertEquals(tokenA, a.fencingToken());
            assertFalse(permit.isSuspended());
            Description d = client.describe("holders/b");
            assertEquals(tokenB, d.holders().get(0).fencingToken());
            assertTrue(d.holders().get(0).holder().startsWith("thread-"), d.toString());

            // The waiter's wait went with the old stream; it asked again and still waits
            // (Describe's count of waiters would include the dead sidecar's entry).
            assertFalse(waiter.isDone());
            a.unlock();
            assertTrue(waiter.get(10, TimeUnit.SECONDS) > tokenA);
            permit.close();
            pool.submit(b::unlock).get();
        } finally {
            pool.shutdownNow();
        }
    }

    @Test
    void aLockUnlockedWhileSuspendedIsGivenBackByTheResumedSession() throws Exception {
        sidecar = Sidecar.start(redis.url(), "--attachment-ttl", "600ms");
        try (LocksideClient client = connect(); LocksideClient other = LocksideClient.connect(
                ClientOptions.defaults().address(sidecar.address()).waitForSidecar(Duration.ofSeconds(10)))) {
            LocksideLock lock = client.lock("break/unlock-while-suspended");
            lock.lock();
            Await.until("recorded", Duration.ofSeconds(5), () -> redis.recorded(client.sessionId(), 1));
            sidecar.kill();
            assertEquals("suspended break/unlock-while-suspended", events.next(5000));
            lock.unlock(); // the app is done with it
            assertFalse(lock.isHeldByCurrentThread());
            sidecar.restart();
            Await.until("the resumed session gave the lock back", Duration.ofSeconds(10),
                    () -> client.describe("break/unlock-while-suspended").holders().isEmpty());
            assertTrue(events.quiet(), "neither restored nor lost: it was not held any more");
            LocksideLock theirs = other.lock("break/unlock-while-suspended");
            assertTrue(theirs.tryLock(), "free for another client");
            theirs.unlock();
        }
    }

    @Test
    void aSidecarOnTheMemoryStoreKilledLosesTheLockAtOnce() throws Exception {
        sidecar = Sidecar.memory();
        try (LocksideClient client = connect()) {
            LocksideLock lock = client.lock("break/memory");
            lock.lock();
            sidecar.kill();
            assertEquals("lost break/memory", events.next(5000));
            lock.lost().get(5, TimeUnit.SECONDS);
            assertFalse(lock.isSuspended());
            assertFalse(lock.isHeldByCurrentThread());
            assertThrows(LockLostException.class, lock::unlock, "unlock says the lock was lost");
            assertThrows(IllegalMonitorStateException.class, lock::unlock, "and that was the last hold");

            // A new session once the sidecar is back.
            sidecar.restart();
            assertTrue(lock.tryLock(5, TimeUnit.SECONDS));
            lock.unlock();
        }
    }

    @Test
    void aSidecarThatDoesNotComeBackWithinTheTtlLosesTheLock() throws Exception {
        sidecar = Sidecar.start(redis.url(), "--attachment-ttl", "600ms");
        try (LocksideClient client = connect()) {
            LocksideLock lock = client.lock("break/gone", LockOptions.defaults().ttl(Duration.ofSeconds(2)));
            lock.lock();
            sidecar.kill();
            long broke = System.nanoTime();
            assertEquals("suspended break/gone", events.next(5000));
            assertEquals("lost break/gone", events.next(10_000));
            long ms = (System.nanoTime() - broke) / 1_000_000;
            assertTrue(ms >= 1500 && ms < 6000, "lost " + ms + " ms after the kill (TTL 2 s)");
            assertThrows(LockLostException.class, lock::unlock);
        }
    }

    @Test
    void aFrozenSidecarIsNoticedByKeepaliveBeforeTheStoreLetsTheLockGo() throws Exception {
        sidecar = Sidecar.start(redis.url(), "--attachment-ttl", "600ms");
        try (Sidecar elsewhere = Sidecar.start(redis.url());
                LocksideClient client = connect();
                LocksideClient other = LocksideClient.connect(elsewhere.address())) {
            LocksideLock lock = client.lock("break/frozen", LockOptions.defaults().ttl(Duration.ofSeconds(5)));
            lock.lock();
            LocksideLock theirs = other.lock("break/frozen");
            CompletableFuture<Long> grantedAt = CompletableFuture.supplyAsync(() -> {
                theirs.lock();
                long at = System.nanoTime();
                theirs.unlock();
                return at;
            });
            Await.until("the waiter elsewhere is queued", Duration.ofSeconds(5),
                    () -> other.describe("break/frozen").waiters() == 1);

            sidecar.freeze();
            long frozen = System.nanoTime();
            assertEquals("suspended break/frozen", events.next(6000));
            long suspendedAt = System.nanoTime();
            assertTrue(suspendedAt - frozen < 4_000_000_000L,
                    "suspended " + (suspendedAt - frozen) / 1_000_000 + " ms after the freeze (keepalive 1 s / 1 s)");
            // The frozen sidecar renews nothing: the store lets the lock go after its
            // TTL, and only then is the waiter elsewhere granted, after the suspension.
            long granted = grantedAt.get(15, TimeUnit.SECONDS);
            assertTrue(granted > suspendedAt, "suspended before anybody else was granted");
            // Thawed, the sidecar finds the stream gone: the lock does not come back.
            sidecar.thaw();
            assertEquals("lost break/frozen", events.next(10_000));
            assertThrows(LockLostException.class, lock::unlock);
        }
    }

    @Test
    void aCleanSidecarStopLosesTheLockWithoutResuming() throws Exception {
        sidecar = Sidecar.start(redis.url());
        try (LocksideClient client = connect()) {
            LocksideLock lock = client.lock("break/sigterm");
            lock.lock();
            sidecar.stop();
            assertEquals("lost break/sigterm", events.next(10_000));
            assertTrue(events.quiet(), "never suspended-then-restored");
        }
    }
}
