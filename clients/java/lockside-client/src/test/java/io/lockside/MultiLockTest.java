package io.lockside;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.lockside.testkit.Await;
import io.lockside.testkit.RedisServer;
import io.lockside.testkit.Sidecar;
import io.lockside.testkit.SidecarExtension;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Lock;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.RegisterExtension;

/** client.multiLock: several keys as one java.util.concurrent.locks.Lock, all or none. */
class MultiLockTest {
    @RegisterExtension
    static final SidecarExtension<LocksideClient> sidecar = SidecarExtension.connecting(LocksideClient::connect);
    LocksideClient client;
    String prefix;

    @BeforeEach
    void connect() {
        client = sidecar.client();
        prefix = "multi/" + sidecar.testName() + "/";
    }

    private boolean free(String key) {
        return client.describe(key).holders().isEmpty();
    }

    @Test
    void everyKeyIsHeldWithItsOwnTokenInTheOrderGiven() throws Exception {
        String a = prefix + "a";
        String b = prefix + "b";
        for (int i = 0; i < 3; i++) { // b has a history of its own
            LocksideLock one = client.lock(b);
            one.lock();
            one.unlock();
        }
        long bBefore = client.describe(b).fencingToken();
        LocksideMultiLock both = client.multiLock(b, a);
        both.lock();
        try {
            assertEquals(List.of(b, a), both.keys());
            long[] tokens = both.fencingTokens();
            assertEquals(2, tokens.length);
            assertTrue(tokens[0] > bBefore, "b's token grows from b's history");
            for (int i = 0; i < 2; i++) {
                String k = both.keys().get(i);
                Description d = client.describe(k);
                assertEquals(1, d.holders().size(), k);
                assertEquals(tokens[i], d.holders().get(0).fencingToken(), k + ": the token Describe shows");
                assertEquals(LocksideLock.currentHolder(), d.holders().get(0).holder());
                assertEquals(tokens[i], both.fencingToken(k));
                assertEquals(tokens[i], client.lock(k).fencingToken(), "the thread's grant, as client.lock(key) sees it");
            }
            assertTrue(both.isHeldByCurrentThread());
            assertEquals(1, both.getHoldCount());
            assertFalse(both.isSuspended());
            assertThrows(IllegalArgumentException.class, () -> both.fencingToken(prefix + "c"));
            Throwable other = CompletableFuture.supplyAsync(() -> {
                try {
                    both.unlock();
                    return null;
                } catch (Throwable t) {
                    return t;
                }
            }).get(10, TimeUnit.SECONDS);
            assertTrue(other instanceof IllegalMonitorStateException, "another thread's unlock: " + other);
            assertTrue(CompletableFuture.supplyAsync(() -> !both.tryLock()).get(10, TimeUnit.SECONDS),
                    "another thread is excluded");
        } finally {
            both.unlock();
        }
        long aAfter = client.describe(a).fencingToken();
        long bAfter = client.describe(b).fencingToken();
        assertTrue(free(a) && free(b));
        assertFalse(both.isHeldByCurrentThread());
        assertThrows(IllegalMonitorStateException.class, both::unlock);
        assertThrows(IllegalMonitorStateException.class, both::fencingTokens);
        assertTrue(both.tryLock());
        assertTrue(both.fencingToken(b) > bAfter && both.fencingToken(a) > aAfter, "new grants, larger tokens");
        both.unlock();
    }

    @Test
    void allOrNoneAfterBusyTimeoutAndInterrupt() throws Exception {
        String a = prefix + "a";
        String b = prefix + "b";
        String c = prefix + "c";
        ExecutorService holderThread = Executors.newSingleThreadExecutor();
        LocksideLock busy = client.lock(b);
        try {
            holderThread.submit(busy::lock).get(10, TimeUnit.SECONDS);
            LocksideMultiLock all = client.multiLock(a, b, c);

            assertFalse(all.tryLock(), "b is busy");
            assertTrue(free(a) && free(c), "nothing held after busy");
            long start = System.nanoTime();
            assertFalse(all.tryLock(200, TimeUnit.MILLISECONDS));
            assertTrue(System.nanoTime() - start >= TimeUnit.MILLISECONDS.toNanos(190), "waited its timeout");
            assertTrue(free(a) && free(c), "nothing held after a timeout");
            assertEquals(0, all.getHoldCount());

            // An interrupted wait is cancelled on the sidecar.
            CompletableFuture<Throwable> waited = new CompletableFuture<>();
            Thread waiter = new Thread(() -> {
                try {
                    all.lockInterruptibly();
                    waited.complete(null);
                } catch (Throwable t) {
                    waited.complete(t);
                }
            });
            waiter.start();
            Await.until("the multiLock waits for b", Duration.ofSeconds(5), () -> client.describe(b).waiters() == 1);
            waiter.interrupt();
            Throwable t = waited.get(10, TimeUnit.SECONDS);
            assertTrue(t instanceof InterruptedException, "got " + t);
            Await.until("nobody waits for b", Duration.ofSeconds(5), () -> client.describe(b).waiters() == 0);
            assertTrue(free(a) && free(c), "nothing held after an interrupt");

            // A wait that is answered: as soon as b is freed.
            Future<long[]> got = Executors.newSingleThreadExecutor().submit(() -> {
                all.lock();
                try {
                    return all.fencingTokens();
                } finally {
                    all.unlock();
                }
            });
            Await.until("the multiLock waits again", Duration.ofSeconds(5), () -> client.describe(b).waiters() == 1);
            assertFalse(got.isDone());
            long bToken = holderThread.submit(busy::fencingToken).get(10, TimeUnit.SECONDS);
            holderThread.submit(busy::unlock).get(10, TimeUnit.SECONDS);
            long[] tokens = got.get(10, TimeUnit.SECONDS);
            assertTrue(tokens[1] > bToken, "b granted after its holder let go");
        } finally {
            holderThread.shutdownNow();
        }
        assertTrue(free(a) && free(b) && free(c));
    }

    @Test
    void aThreadHoldingSomeKeysTakesTheOthersAndUnlocksAsOften() throws Exception {
        String a = prefix + "a";
        String b = prefix + "b";
        String c = prefix + "c";
        LocksideLock one = client.lock(a);
        one.lock();
        long aToken = one.fencingToken();
        LocksideMultiLock ab = client.multiLock(a, b);
        ab.lock();
        assertEquals(2, one.getHoldCount(), "a held once more");
        assertEquals(aToken, ab.fencingToken(a), "a reentrant hold keeps the grant's token");
        assertEquals(1, client.describe(a).holders().get(0).holdCount(), "the sidecar holds a once");
        ab.lock(); // every key held: no round trip
        assertEquals(2, ab.getHoldCount());
        // Three keys, two held already: one Acquire for the third.
        LocksideMultiLock abc = client.multiLock(c, b, a);
        abc.lock();
        assertEquals(1, abc.getHoldCount());
        abc.unlock();
        assertTrue(free(c));
        ab.unlock();
        ab.unlock();
        assertFalse(free(a), "a still held by the single lock");
        assertTrue(free(b));
        one.unlock();
        assertTrue(free(a));
    }

    @Test
    void badKeysAreRefusedAndTheSessionGoesOn() {
        assertThrows(IllegalArgumentException.class, () -> client.multiLock(prefix + "only"));
        assertThrows(IllegalArgumentException.class, () -> client.multiLock(prefix + "x", prefix + "x"));
        String[] many = new String[65];
        for (int i = 0; i < many.length; i++) {
            many[i] = prefix + i;
        }
        assertThrows(IllegalArgumentException.class, () -> client.multiLock(many));
        assertThrows(NullPointerException.class, () -> client.multiLock(prefix + "x", null));
        LocksideMultiLock bad = client.multiLock(prefix + "x", "");
        LocksideRejectedException e = assertThrows(LocksideRejectedException.class, bad::lock);
        assertEquals(3, e.code(), e.getMessage());
        assertThrows(UnsupportedOperationException.class, bad::newCondition);
        assertTrue(free(prefix + "x"));
        Lock fine = client.multiLock(prefix + "x", prefix + "y");
        assertTrue(fine.tryLock(), "the session goes on");
        fine.unlock();
    }

    /**
     * The dining philosophers: five threads on two clients of two sidecars of one Redis,
     * each taking its two forks in an order of its own (one always reversed: a cycle),
     * some rounds. One lock after the other in these orders would deadlock.
     */
    @Test
    void threadsTakingOverlappingSetsInOppositeOrdersNeverDeadlock() throws Exception {
        try (RedisServer redis = RedisServer.start();
                Sidecar one = Sidecar.start(redis.url());
                Sidecar two = Sidecar.start(redis.url());
                LocksideClient first = LocksideClient.connect(one.address());
                LocksideClient second = LocksideClient.connect(two.address())) {
            int philosophers = 5;
            int rounds = 12;
            Map<String, Integer> holding = new HashMap<>();
            Map<String, List<Long>> tokens = new HashMap<>();
            ExecutorService pool = Executors.newFixedThreadPool(philosophers);
            List<Future<Integer>> eaten = new ArrayList<>();
            for (int p = 0; p < philosophers; p++) {
                int me = p;
                LocksideClient c = p % 2 == 0 ? first : second;
                eaten.add(pool.submit(() -> {
                    Random rng = new Random(me);
                    int meals = 0;
                    for (int r = 0; r < rounds; r++) {
                        String left = "fork/" + me;
                        String right = "fork/" + ((me + 1) % philosophers);
                        LocksideMultiLock forks = me == 0 || rng.nextBoolean()
                                ? c.multiLock(right, left) : c.multiLock(left, right);
                        forks.lock();
                        try {
                            synchronized (holding) {
                                for (String k : forks.keys()) {
                                    if (holding.merge(k, 1, Integer::sum) > 1) {
                                        throw new AssertionError(k + " has two holders");
                                    }
                                    tokens.computeIfAbsent(k, x -> new ArrayList<>()).add(forks.fencingToken(k));
                                }
                            }
                            Thread.sleep(1); // eating: long enough to overlap if it could
                            synchronized (holding) {
                                for (String k : forks.keys()) {
                                    holding.merge(k, -1, Integer::sum);
                                }
                            }
                            meals++;
                        } finally {
                            forks.unlock();
                        }
                    }
                    return meals;
                }));
            }
            try {
                for (Future<Integer> f : eaten) {
                    assertEquals(rounds, f.get(60, TimeUnit.SECONDS), "every philosopher eats every round");
                }
            } finally {
                pool.shutdownNow();
            }
            tokens.forEach((k, ts) -> {
                for (int i = 1; i < ts.size(); i++) {
                    assertTrue(ts.get(i) > ts.get(i - 1), k + ": tokens increase in grant order: " + ts);
                }
            });
        }
    }

    @Test
    void eachKeyIsSuspendedRestoredAndLostOnItsOwn() throws Exception {
        Recorder events = new Recorder();
        try (RedisServer redis = RedisServer.start();
                Sidecar side = Sidecar.start(redis.url(), "--attachment-ttl", "600ms");
                LocksideClient c = LocksideClient.connect(
                        ClientOptions.defaults().address(side.address()).listener(events))) {
            LocksideMultiLock both = c.multiLock(List.of("move/from", "move/to"),
                    LockOptions.defaults().ttl(Duration.ofSeconds(10)));
            both.lock();
            long[] tokens = both.fencingTokens();
            Await.until("the session record lists both grants", Duration.ofSeconds(5),
                    () -> redis.recorded(c.sessionId(), 2));
            side.kill();
            List<String> seen = new ArrayList<>(List.of(events.next(5000), events.next(5000)));
            seen.sort(null);
            assertEquals(List.of("suspended move/from", "suspended move/to"), seen);
            assertTrue(both.isSuspended());
            side.restart();
            seen = new ArrayList<>(List.of(events.next(10_000), events.next(10_000)));
            seen.sort(null);
            assertEquals(List.of("restored move/from", "restored move/to"), seen);
            assertFalse(both.isSuspended());
            assertArrayEquals(tokens, both.fencingTokens(), "the same tokens");
            assertFalse(both.lost().isDone());

            // Lost: the keys vanish from the store; lost() completes at the first loss.
            CompletableFuture<Void> lost = both.lost();
            assertEquals("+OK", redis.command("FLUSHALL"));
            lost.get(5, TimeUnit.SECONDS);
            Await.until("both keys lost", Duration.ofSeconds(5), () -> !both.isHeldByCurrentThread()
                    && c.heldLocks() == 0);
            LockLostException e = assertThrows(LockLostException.class, both::unlock);
            assertEquals(1, e.getSuppressed().length, "the other key's loss, suppressed");
            assertThrows(IllegalMonitorStateException.class, both::unlock, "every hold was given back");
        }
    }
}
