package io.lockside.spring;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.lockside.LocksideClient;
import io.lockside.testkit.SidecarExtension;
import java.time.Duration;
import java.util.ConcurrentModificationException;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.extension.RegisterExtension;
import org.springframework.scheduling.concurrent.SimpleAsyncTaskScheduler;

/**
 * A TTL is a lease, as Spring's registries document it (RedisLockRegistry, JdbcLockRegistry,
 * RenewableLockRegistry): the lock expires unless renewed, unlock() after that throws,
 * and another registry then gets it.
 */
@Timeout(60)
class LocksideLeaseTest {
    @RegisterExtension
    static final SidecarExtension<LocksideClient> sidecar = SidecarExtension.connecting(LocksideClient::connect);
    LocksideClient mine;
    LocksideClient theirs;
    String key;

    @BeforeEach
    void connect() {
        mine = sidecar.client();
        theirs = LocksideClient.connect(sidecar.address());
        key = sidecar.testName();
    }

    @AfterEach
    void close() {
        theirs.close();
    }

    /** Waits until a registry of another client takes `key`, and says how long that took. */
    private long takenByAnotherAfterMillis(String k) throws InterruptedException {
        long start = System.nanoTime();
        LocksideDistributedLock other = new LocksideLockRegistry(theirs).obtain(k);
        assertTrue(other.tryLock(10, TimeUnit.SECONDS), "another registry gets it once the lease ran out");
        other.unlock();
        return TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - start);
    }

    @Test
    void aLeaseOf100MsRunsOutAndAnotherRegistryGetsTheLock() throws Exception {
        LocksideLockRegistry registry = new LocksideLockRegistry(mine);
        LocksideDistributedLock lock = registry.obtain(key);
        assertTrue(lock.tryLock(Duration.ofSeconds(1), Duration.ofMillis(100)));
        long took = takenByAnotherAfterMillis(key);
        assertTrue(took < 900, "within the lease and a little, not the 1 s store TTL: " + took + " ms");
        assertFalse(lock.isHeldByCurrentThread());
        ConcurrentModificationException e = assertThrows(ConcurrentModificationException.class, lock::unlock);
        assertTrue(e.getMessage().startsWith("Lock was released in the store due to expiration."), e.getMessage());
        assertThrows(IllegalStateException.class, lock::unlock, "the local hold is given back all the same");
    }

    @Test
    void expireAfterIsTheLeaseOfEveryLockTakenWithoutATtl() throws Exception {
        LocksideLockRegistry registry = new LocksideLockRegistry(mine, "", Duration.ofMillis(200));
        assertEquals(Duration.ofMillis(200), registry.getExpireAfter());
        LocksideDistributedLock lock = registry.obtain(key);
        lock.lock();
        takenByAnotherAfterMillis(key);
        assertThrows(ConcurrentModificationException.class, lock::unlock);
        assertTrue(lock.tryLock(), "free again for this registry");
        lock.unlock();
    }

    @Test
    void renewLockExtendsTheLease() throws Exception {
        LocksideLockRegistry registry = new LocksideLockRegistry(mine);
        LocksideDistributedLock lock = registry.obtain(key);
        LocksideDistributedLock other = new LocksideLockRegistry(theirs).obtain(key);
        assertTrue(lock.tryLock(Duration.ofMillis(100), Duration.ofMillis(300)));
        registry.renewLock(key, Duration.ofSeconds(3));
        assertFalse(other.tryLock(800, TimeUnit.MILLISECONDS), "renewed past its first 300 ms");
        lock.unlock();
        assertTrue(other.tryLock(5, TimeUnit.SECONDS));
        other.unlock();
    }

    @Test
    void renewLockFromAnotherThreadOfTheRegistryWorksAndANotHeldLockCannotBeRenewed() throws Exception {
        LocksideLockRegistry registry = new LocksideLockRegistry(mine, "", Duration.ofMillis(300));
        registry.obtain(key);
        assertThrows(IllegalStateException.class, () -> registry.renewLock(key), "never locked");
        LocksideDistributedLock lock = registry.obtain(key);
        lock.lock();
        sidecar.pool().submit(() -> registry.renewLock(key, Duration.ofSeconds(3))).get();
        assertFalse(new LocksideLockRegistry(theirs).obtain(key).tryLock(800, TimeUnit.MILLISECONDS));
        lock.unlock();
        assertThrows(IllegalStateException.class, () -> registry.renewLock(key), "unlocked");
    }

    @Test
    void aRenewalSchedulerKeepsTheLeaseWhileHeld() throws Exception {
        LocksideLockRegistry registry = new LocksideLockRegistry(mine, "", Duration.ofMillis(300));
        SimpleAsyncTaskScheduler scheduler = new SimpleAsyncTaskScheduler();
        try {
            registry.setRenewalTaskScheduler(scheduler);
            LocksideDistributedLock lock = registry.obtain(key);
            lock.lock();
            assertFalse(new LocksideLockRegistry(theirs).obtain(key).tryLock(1, TimeUnit.SECONDS),
                    "renewed every 100 ms");
            lock.unlock();
        } finally {
            scheduler.close();
        }
    }

    @Test
    void aReentrantLockStartsTheLeaseAgainAndOneAfterExpiryTakesTheLockAgain() throws Exception {
        LocksideLockRegistry registry = new LocksideLockRegistry(mine);
        LocksideDistributedLock lock = registry.obtain(key);
        assertTrue(lock.tryLock(Duration.ofSeconds(1), Duration.ofMillis(100)));
        LocksideDistributedLock probe = new LocksideLockRegistry(theirs).obtain(key);
        assertTrue(probe.tryLock(Duration.ofSeconds(10), Duration.ofSeconds(5)), "the lease runs out");
        probe.unlock();
        assertTrue(lock.tryLock(Duration.ofSeconds(1), Duration.ofSeconds(5)), "held in the store again");
        assertFalse(probe.tryLock(300, TimeUnit.MILLISECONDS));
        lock.unlock(); // the inner hold
        lock.unlock(); // the outer one: releases, no exception (it was taken again)
        assertTrue(probe.tryLock(5, TimeUnit.SECONDS));
        probe.unlock();
    }

    @Test
    void tryLockWithTheLongestTimeoutWaitsAsLockDoes() throws Exception {
        LocksideDistributedLock lock = new LocksideLockRegistry(mine).obtain(key);
        assertTrue(lock.tryLock(Long.MAX_VALUE, TimeUnit.MILLISECONDS), "no overflow into a wait of no time");
        LocksideDistributedLock other = new LocksideLockRegistry(theirs).obtain(key);
        var waiting = sidecar.pool().submit(() -> {
            boolean got = other.tryLock(Long.MAX_VALUE, TimeUnit.MILLISECONDS);
            other.unlock();
            return got;
        });
        assertThrows(java.util.concurrent.TimeoutException.class, () -> waiting.get(300, TimeUnit.MILLISECONDS));
        lock.unlock();
        assertTrue(waiting.get(10, TimeUnit.SECONDS));
    }

    @Test
    void aLeaseRunsFromTheGrantNotFromAWaitBeforeIt() throws Exception {
        LocksideDistributedLock held = new LocksideLockRegistry(theirs).obtain(key);
        java.util.concurrent.CountDownLatch locked = new java.util.concurrent.CountDownLatch(1);
        var unlocking = sidecar.pool().submit(() -> {
            held.lock();
            locked.countDown();
            Thread.sleep(800);
            held.unlock();
            return null;
        });
        assertTrue(locked.await(10, TimeUnit.SECONDS));
        LocksideDistributedLock lock = new LocksideLockRegistry(mine).obtain(key);
        assertTrue(lock.tryLock(Duration.ofSeconds(10), Duration.ofMillis(500)), "waited 800 ms for it");
        Thread.sleep(200); // well inside a 500 ms lease from the grant; long past one from the ask
        assertTrue(lock.isHeldByCurrentThread(), "a 500 ms lease, not spent by the wait");
        lock.unlock();
        unlocking.get();
    }

    @Test
    void aTtlMustBePositive() {
        LocksideDistributedLock lock = new LocksideLockRegistry(mine).obtain(key);
        assertThrows(IllegalArgumentException.class, () -> lock.lock(Duration.ZERO));
        assertThrows(IllegalArgumentException.class, () -> new LocksideLockRegistry(mine, "", Duration.ofMillis(-1)));
        assertFalse(lock.isAcquiredInThisProcess(), "a refused lock() leaves nothing held");
    }
}
