package io.lockside.spring;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotSame;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.lockside.LocksideClient;
import io.lockside.testkit.Await;
import io.lockside.testkit.Contention;
import io.lockside.testkit.SidecarExtension;
import java.time.Duration;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.locks.Lock;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.RegisterExtension;
import org.springframework.integration.support.locks.LockRegistry;

/** Spring Integration's LockRegistry contract, as its own registries' tests check it. */
class LocksideLockRegistryTest {
    @RegisterExtension
    static final SidecarExtension<LocksideClient> sidecar = SidecarExtension.connecting(LocksideClient::connect);
    LocksideClient client;
    LocksideLockRegistry registry;
    String key;
    ExecutorService pool;

    @BeforeEach
    void connect() {
        client = sidecar.client();
        registry = new LocksideLockRegistry(client, "spring:");
        key = sidecar.testName();
        pool = sidecar.pool();
    }

    @Test
    void lockAndUnlock() {
        Lock lock = registry.obtain(key);
        lock.lock();
        try {
            assertEquals(1, client.describe("spring:" + key).holders().size(), "held under the registry's prefix");
        } finally {
            lock.unlock();
        }
        assertTrue(client.describe("spring:" + key).holders().isEmpty());
    }

    @Test
    void reentrantOnOneThreadThroughAnyObtainedObject() throws Exception {
        Lock first = registry.obtain(key);
        Lock second = registry.obtain(key);
        first.lockInterruptibly();
        assertTrue(second.tryLock(), "the same lock for the same thread");
        second.unlock();
        assertFalse(pool.submit(() -> registry.obtain(key).tryLock()).get(), "still held after one of two unlocks");
        first.unlock();
        assertTrue(pool.submit(() -> {
            Lock l = registry.obtain(key);
            boolean got = l.tryLock();
            l.unlock();
            return got;
        }).get());
    }

    @Test
    void threadsSharingTheRegistryTakeTurns() throws Exception {
        int most = Contention.mostInside(4, 20, 1, inside -> {
            Lock lock = registry.obtain(key);
            lock.lockInterruptibly();
            try {
                inside.run();
            } finally {
                lock.unlock();
            }
        });
        assertEquals(1, most);
    }

    @Test
    void unlockByAnotherThreadThrowsIllegalStateExceptionAsSpringsRegistriesDo() throws Exception {
        LocksideDistributedLock lock = registry.obtain(key);
        lock.lock();
        Future<?> other = pool.submit(() -> registry.obtain(key).unlock());
        Throwable cause = assertThrows(java.util.concurrent.ExecutionException.class, other::get).getCause();
        assertTrue(cause instanceof IllegalStateException, "got " + cause);
        assertTrue(cause.getMessage().contains("You do not own lock at spring:" + key), cause.getMessage());
        assertTrue(lock.isHeldByCurrentThread());
        lock.unlock();
        assertThrows(IllegalStateException.class, lock::unlock, "nor by the owner once it gave it back");
    }

    @Test
    void obtainGivesTheSameObjectForAKeyWhileItIsInUse() throws Exception {
        LocksideDistributedLock first = registry.obtain(key);
        assertSame(first, registry.obtain(key));
        assertNotSame(first, registry.obtain(key + "-other"));
        first.lock();
        assertSame(first, pool.submit(() -> registry.obtain(key)).get(), "from another thread too");
        first.unlock();
        assertSame(first, registry.obtain(key));
        assertNotSame(first, new LocksideLockRegistry(client, "spring:").obtain(key), "another registry's own");
    }

    @Test
    void unusedLocksAreLeftToTheGarbageCollectorAndHeldOnesAreKept() {
        LocksideLockRegistry own = new LocksideLockRegistry(client, "gc:");
        own.obtain(key).lock(); // held, then no reference to it is kept here
        for (int i = 0; i < 1000; i++) {
            own.obtain(key + i);
        }
        Await.until("unused locks collected", Duration.ofSeconds(20), () -> {
            System.gc();
            return own.cachedLocks() < 100;
        });
        LocksideDistributedLock held = own.obtain(key);
        assertTrue(held.isHeldByCurrentThread(), "a held lock is the same object after a collection");
        held.unlock();
        own.obtain(key + "x").lock();
        own.obtain(key + "x").unlock();
        own.expireUnusedOlderThan(0);
        assertEquals(0, own.cachedLocks(), "expireUnusedOlderThan forgets what nobody holds");
    }

    @Test
    void twoRegistriesOnTwoClientsExcludeEachOther() throws Exception {
        try (LocksideClient otherClient = LocksideClient.connect(sidecar.address())) {
            LockRegistry<LocksideDistributedLock> other = new LocksideLockRegistry(otherClient, "spring:");
            Lock mine = registry.obtain(key);
            Lock theirs = other.obtain(key);
            mine.lock();
            assertFalse(theirs.tryLock(100, TimeUnit.MILLISECONDS));
            Future<Boolean> waiting = pool.submit(() -> {
                boolean got = theirs.tryLock(10, TimeUnit.SECONDS);
                theirs.unlock();
                return got;
            });
            mine.unlock();
            assertTrue(waiting.get(20, TimeUnit.SECONDS));
        }
    }

    @Test
    void executeLockedRunsUnderTheLockAndTimesOutWhenItStaysBusy() throws Exception {
        String out = registry.executeLocked(key, () -> {
            assertTrue(registry.obtain(key).isHeldByCurrentThread());
            return "done";
        });
        assertEquals("done", out);
        assertFalse(registry.obtain(key).isHeldByCurrentThread(), "released after");

        LocksideDistributedLock lock = registry.obtain(key);
        lock.lock();
        try {
            Future<?> busy = pool.submit(() -> {
                registry.executeLocked(key, Duration.ofMillis(200), () -> {
                    throw new AssertionError("ran without the lock");
                });
                return null;
            });
            Throwable cause = assertThrows(java.util.concurrent.ExecutionException.class,
                    () -> busy.get(10, TimeUnit.SECONDS)).getCause();
            assertTrue(cause instanceof TimeoutException, "got " + cause);
        } finally {
            lock.unlock();
        }
    }

    @Test
    void withoutATtlALockIsHeldForAsLongAsTheSessionLives() throws Exception {
        LocksideDistributedLock lock = registry.obtain(key);
        assertTrue(lock.tryLock(1, TimeUnit.SECONDS));
        try {
            assertTrue(lock.fencingToken() > 0);
            assertFalse(lock.isSuspended());
            renewalsOf(key).run();
            assertTrue(lock.isHeldByCurrentThread());
            registry.renewLock(key); // nothing to renew: no lease
        } finally {
            lock.unlock();
        }
    }

    /** Another registry cannot take it for 1.5 s. */
    private Runnable renewalsOf(String k) {
        return () -> {
            try (LocksideClient other = LocksideClient.connect(sidecar.address())) {
                LocksideLockRegistry theirs = new LocksideLockRegistry(other, "spring:");
                assertFalse(theirs.obtain(k).tryLock(Duration.ofMillis(1500), Duration.ofSeconds(1)),
                        "held past its store TTL");
            } catch (InterruptedException e) {
                throw new AssertionError(e);
            }
        };
    }

    @Test
    void keysAreStrings() {
        assertThrows(IllegalArgumentException.class, () -> registry.obtain(42));
    }
}
