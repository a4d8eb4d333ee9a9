package io.lockside.shedlock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.lockside.LocksideClient;
import io.lockside.testkit.Await;
import io.lockside.testkit.Contention;
import io.lockside.testkit.SidecarExtension;
import java.time.Duration;
import java.util.Optional;
import java.util.concurrent.atomic.AtomicInteger;
import net.javacrumbs.shedlock.core.ClockProvider;
import net.javacrumbs.shedlock.core.DefaultLockingTaskExecutor;
import net.javacrumbs.shedlock.core.LockAssert;
import net.javacrumbs.shedlock.core.LockConfiguration;
import net.javacrumbs.shedlock.core.LockProvider;
import net.javacrumbs.shedlock.core.SimpleLock;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.RegisterExtension;

/**
 * ShedLock's provider cases (its AbstractLockProviderIntegrationTest and
 * AbstractExtensibleLockProviderIntegrationTest, whose test-support artifact is not
 * published), written here from ShedLock's documented behaviour; waits poll the lock
 * instead of sleeping a fixed time.
 */
class LocksideLockProviderTest {
    static final Duration LOCK_AT_MOST_FOR = Duration.ofSeconds(60);

    @RegisterExtension
    static final SidecarExtension<LocksideClient> sidecar = SidecarExtension.connecting(LocksideClient::connect);
    LocksideClient client;
    LockProvider provider;
    String name;

    @BeforeEach
    void connect() {
        client = sidecar.client();
        provider = new LocksideLockProvider(client, "shedlock:");
        name = sidecar.testName();
    }

    static LockConfiguration config(String name, Duration atMost, Duration atLeast) {
        return new LockConfiguration(ClockProvider.now(), name, atMost, atLeast);
    }

    Optional<SimpleLock> lock(String name) {
        return provider.lock(config(name, LOCK_AT_MOST_FOR, Duration.ZERO));
    }

    /** Nobody may take the lock now. */
    void assertLocked(String name) {
        assertTrue(lock(name).isEmpty(), name + " is locked");
    }

    /** The lock can be taken now (and is given back). */
    void assertUnlocked(String name) {
        Optional<SimpleLock> l = lock(name);
        assertTrue(l.isPresent(), name + " is unlocked");
        l.get().unlock();
    }

    /** Polls until the lock can be taken (taking and giving it back); how long it took. */
    Duration awaitUnlocked(String name, Duration timeout) {
        long start = System.nanoTime();
        Await.until(name + " unlocked", timeout, () -> lock(name).map(l -> {
            l.unlock();
            return true;
        }).orElse(false));
        return Duration.ofNanos(System.nanoTime() - start);
    }

    @Test
    void shouldCreateLock() {
        Optional<SimpleLock> lock = lock(name);
        assertTrue(lock.isPresent());
        assertLocked(name);
        lock.get().unlock();
        assertUnlocked(name);
    }

    @Test
    void shouldNotReturnSecondLock() {
        Optional<SimpleLock> lock = lock(name);
        assertTrue(lock.isPresent());
        assertTrue(lock(name).isEmpty());
        lock.get().unlock();
    }

    @Test
    void shouldCreateTwoIndependentLocks() {
        Optional<SimpleLock> a = lock(name + "-1");
        Optional<SimpleLock> b = lock(name + "-2");
        assertTrue(a.isPresent());
        assertTrue(b.isPresent());
        a.get().unlock();
        assertLocked(name + "-2");
        assertUnlocked(name + "-1");
        b.get().unlock();
    }

    @Test
    void shouldLockTwiceInARow() {
        lock(name).orElseThrow().unlock();
        lock(name).orElseThrow().unlock();
        assertUnlocked(name);
    }

    @Test
    void shouldExcludeAnotherClient() throws Exception {
        try (LocksideClient other = LocksideClient.connect(sidecar.address())) {
            LockProvider theirs = new LocksideLockProvider(other, "shedlock:");
            SimpleLock mine = lock(name).orElseThrow();
            assertTrue(theirs.lock(config(name, LOCK_AT_MOST_FOR, Duration.ZERO)).isEmpty());
            mine.unlock();
            theirs.lock(config(name, LOCK_AT_MOST_FOR, Duration.ZERO)).orElseThrow().unlock();
        }
    }

    @Test
    void shouldTimeout() {
        Duration atMost = Duration.ofMillis(300);
        Optional<SimpleLock> lock = provider.lock(config(name, atMost, Duration.ZERO));
        assertTrue(lock.isPresent());
        assertLocked(name);
        Duration took = awaitUnlocked(name, Duration.ofSeconds(5));
        assertTrue(took.compareTo(atMost.minusMillis(50)) >= 0, "released after lockAtMostFor, took " + took);
        lock.get().unlock(); // the task ends late: nothing left to release
        assertUnlocked(name);
    }

    @Test
    void shouldHoldUntilLockAtLeastForAfterAnEarlyUnlock() {
        Duration atLeast = Duration.ofMillis(400);
        long start = System.nanoTime();
        SimpleLock lock = provider.lock(config(name, LOCK_AT_MOST_FOR, atLeast)).orElseThrow();
        lock.unlock();
        assertLocked(name);
        awaitUnlocked(name, Duration.ofSeconds(5));
        Duration took = Duration.ofNanos(System.nanoTime() - start);
        assertTrue(took.compareTo(atLeast.minusMillis(50)) >= 0, "held for at least lockAtLeastFor, took " + took);
    }

    @Test
    void shouldNotUnlockTwice() {
        SimpleLock lock = lock(name).orElseThrow();
        lock.unlock();
        assertThrows(IllegalStateException.class, lock::unlock);
    }

    @Test
    void fuzzFourThreadsNeverTwoInside() throws Exception {
        AtomicInteger ran = new AtomicInteger();
        // 1 ms inside: the task.
        int most = Contention.mostInside(4, 50, 1, inside -> {
            Optional<SimpleLock> lock = lock(name);
            if (lock.isPresent()) {
                ran.incrementAndGet();
                inside.run();
                lock.get().unlock();
            }
        });
        assertEquals(1, most);
        assertTrue(ran.get() > 0);
    }

    // -- ExtensibleLockProvider ---------------------------------------------------

    @Test
    void shouldBeAbleToExtendLock() {
        Duration atMost = Duration.ofMillis(300);
        long start = System.nanoTime();
        SimpleLock lock = provider.lock(config(name, atMost, Duration.ZERO)).orElseThrow();
        SimpleLock extended = lock.extend(Duration.ofSeconds(60), Duration.ZERO).orElseThrow();
        // Past the first lockAtMostFor: still locked. (Polled until well past it.)
        Await.until("past the first lockAtMostFor", Duration.ofSeconds(5),
                () -> System.nanoTime() - start > atMost.multipliedBy(2).toNanos());
        assertLocked(name);
        extended.unlock();
        assertUnlocked(name);
    }

    @Test
    void shouldNotBeAbleToExtendExpiredLock() {
        SimpleLock lock = provider.lock(config(name, Duration.ofMillis(200), Duration.ZERO)).orElseThrow();
        awaitUnlocked(name, Duration.ofSeconds(5));
        assertTrue(lock.extend(Duration.ofSeconds(60), Duration.ZERO).isEmpty());
        assertUnlocked(name);
    }

    @Test
    void shouldBeAbleToExtendAtLeast() {
        SimpleLock lock = lock(name).orElseThrow();
        long start = System.nanoTime();
        SimpleLock extended = lock.extend(Duration.ofSeconds(60), Duration.ofMillis(400)).orElseThrow();
        extended.unlock();
        assertLocked(name);
        awaitUnlocked(name, Duration.ofSeconds(5));
        assertTrue(System.nanoTime() - start >= Duration.ofMillis(350).toNanos());
    }

    @Test
    void shouldNotUnlockOrExtendALockThatWasExtended() {
        SimpleLock lock = lock(name).orElseThrow();
        SimpleLock extended = lock.extend(Duration.ofSeconds(60), Duration.ZERO).orElseThrow();
        assertThrows(IllegalStateException.class, lock::unlock);
        assertThrows(IllegalStateException.class, () -> lock.extend(Duration.ofSeconds(60), Duration.ZERO));
        assertLocked(name);
        extended.unlock();
        assertUnlocked(name);
    }

    // -- as ShedLock runs tasks ------------------------------------------------------

    @Test
    void theLockingTaskExecutorRunsTheTaskUnderTheLockAndSkipsItWhenHeld() throws Exception {
        DefaultLockingTaskExecutor executor = new DefaultLockingTaskExecutor(provider);
        AtomicInteger runs = new AtomicInteger();
        executor.executeWithLock((Runnable) () -> {
            LockAssert.assertLocked();
            runs.incrementAndGet();
        }, config(name, LOCK_AT_MOST_FOR, Duration.ZERO));
        assertEquals(1, runs.get());

        SimpleLock held = lock(name).orElseThrow();
        executor.executeWithLock((Runnable) runs::incrementAndGet, config(name, LOCK_AT_MOST_FOR, Duration.ZERO));
        assertEquals(1, runs.get(), "skipped while another holds the lock");
        held.unlock();
    }

    @Test
    void theTtlIsLockAtMostForWithinTheSidecarsRange() {
        assertEquals(Duration.ofSeconds(1), LocksideLockProvider.ttl(Duration.ofMillis(100)));
        assertEquals(Duration.ofSeconds(3), LocksideLockProvider.ttl(Duration.ofSeconds(3)));
        assertEquals(Duration.ofSeconds(10), LocksideLockProvider.ttl(Duration.ofMinutes(14)));
        SimpleLock lock = provider.lock(config(name, Duration.ofSeconds(3), Duration.ZERO)).orElseThrow();
        Duration left = client.describe("shedlock:" + name).holders().get(0).ttlRemaining();
        assertTrue(left.compareTo(Duration.ofSeconds(3)) <= 0, left.toString());
        assertFalse(left.isZero());
        lock.unlock();
    }
}
