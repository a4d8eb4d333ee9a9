package io.lockside.bench;

import io.lockside.LocksideClient;
import io.lockside.LocksideLock;
import io.lockside.testkit.Await;
import io.lockside.testkit.RedisServer;
import io.lockside.testkit.Sidecar;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Arrays;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Lock;
import org.apache.curator.framework.CuratorFramework;
import org.redisson.Redisson;
import org.redisson.api.RedissonClient;
import org.redisson.config.Config;

/**
 * LocksideLock beside Redisson's RLock on the same redis-server, and Curator's
 * InterProcessMutex on a standalone ZooKeeper (Debian's package) on loopback:
 * <ol>
 *   <li>uncontended lock()+unlock() latency, one thread, p50/p99/max;</li>
 *   <li>a holder process SIGKILLed while a waiter elsewhere waits: kill to grant;</li>
 *   <li>handoff between 8 threads in two processes ({@link Handoff}).</li>
 * </ol>
 * Arguments: {@code [cycles]}, or {@code handoff [seconds]} for the handoff alone.
 * Redisson's watchdog timeout is set to 10 s, the sidecar's default TTL, so that both
 * keep a lock of a dead holder equally long at most, and Curator's session timeout to
 * 10 s for the same reason. Not a test: it prints figures.
 */
public final class Bench {
    private static final int WARMUP = 500;

    public static void main(String[] args) throws Exception {
        boolean handoffOnly = args.length > 0 && args[0].equals("handoff");
        int cycles = args.length > 0 && !handoffOnly ? Integer.parseInt(args[0]) : 5000;
        int seconds = handoffOnly && args.length > 1 ? Integer.parseInt(args[1]) : 5;
        try (RedisServer redis = RedisServer.start(); Sidecar sidecar = Sidecar.start(redis.url());
                ZooKeeper zk = ZooKeeper.start()) {
            if (handoffOnly) {
                Handoff.run(sidecar.address(), redis.url(), zk.connect, seconds);
                return;
            }
            RedissonClient redisson = redisson(redis.url());
            CuratorFramework curator = ZooKeeper.curator(zk.connect);
            try (LocksideClient client = LocksideClient.connect(sidecar.address())) {
                System.out.printf("uncontended lock()+unlock(), %d cycles after %d warm-up, one thread%n", cycles,
                        WARMUP);
                report("LocksideLock (sidecar, Redis)", cycles(client.lock("bench/lockside"), cycles));
                report("Redisson RLock (Redis)", cycles(redisson.getLock("bench/redisson"), cycles));
                report("Curator InterProcessMutex (ZK)", cycles(new CuratorLock(curator, "bench/curator"), cycles));

                System.out.println("holder SIGKILLed while a waiter elsewhere waits: kill -> next grant");
                for (int i = 0; i < 3; i++) {
                    LocksideLock waiter = client.lock("bench/takeover-lockside");
                    long ms = takeover(new String[] {"lockside", sidecar.address(), "bench/takeover-lockside"},
                            waiter, () -> client.describe("bench/takeover-lockside").waiters() == 1);
                    System.out.printf("  %-32s %8d ms%n", "LocksideLock", ms);
                }
                long ms = takeover(new String[] {"redisson", redis.url(), "bench/takeover-redisson"},
                        redisson.getLock("bench/takeover-redisson"), null);
                System.out.printf("  %-32s %8d ms  (watchdog timeout 10 s)%n", "Redisson RLock", ms);
                ms = takeover(new String[] {"curator", zk.connect, "bench/takeover-curator"},
                        new CuratorLock(curator, "bench/takeover-curator"), null);
                System.out.printf("  %-32s %8d ms  (session timeout 10 s)%n", "Curator InterProcessMutex", ms);
                Handoff.run(sidecar.address(), redis.url(), zk.connect, seconds);
            } finally {
                redisson.shutdown();
                curator.close();
            }
        }
    }

    static RedissonClient redisson(String url) {
        Config config = new Config();
        config.useSingleServer().setAddress(url);
        config.setLockWatchdogTimeout(10_000);
        return Redisson.create(config);
    }

    static long[] cycles(Lock lock, int cycles) {
        long[] out = new long[cycles];
        for (int i = 0; i < WARMUP + cycles; i++) {
            long start = System.nanoTime();
            lock.lock();
            lock.unlock();
            if (i >= WARMUP) {
                out[i - WARMUP] = System.nanoTime() - start;
            }
        }
        return out;
    }

    static void report(String what, long[] nanos) {
        Arrays.sort(nanos);
        System.out.printf("  %-32s p50 %7.1f us   p99 %7.1f us   max %8.1f us%n", what,
                nanos[nanos.length / 2] / 1e3, nanos[(int) (nanos.length * 0.99)] / 1e3,
                nanos[nanos.length - 1] / 1e3);
    }

    /**
     * Starts a holder process, makes `waiter` wait for its lock, SIGKILLs the holder,
     * and returns the milliseconds from the kill to the waiter's grant.
     */
    static long takeover(String[] holderArgs, Lock waiter, java.util.function.BooleanSupplier queued)
            throws Exception {
        String[] command = new String[4 + holderArgs.length];
        command[0] = ProcessHandle.current().info().command().orElse("java");
        command[1] = "-cp";
        command[2] = System.getProperty("java.class.path");
        command[3] = Holder.class.getName();
        System.arraycopy(holderArgs, 0, command, 4, holderArgs.length);
        Process holder = new ProcessBuilder(command).redirectErrorStream(true).start();
        try {
            BufferedReader out = new BufferedReader(new InputStreamReader(holder.getInputStream(), StandardCharsets.UTF_8));
            for (String line; (line = out.readLine()) != null; ) {
                if (line.equals("HELD")) {
                    break;
                }
            }
            // A thread of its own: the common pool has one thread on 2 cores, and a
            // client's own tasks there would keep the waiter from starting.
            CompletableFuture<Long> granted = new CompletableFuture<>();
            Thread waiting = new Thread(() -> {
                try {
                    waiter.lock();
                    long at = System.nanoTime();
                    waiter.unlock();
                    granted.complete(at);
                } catch (RuntimeException e) {
                    granted.completeExceptionally(e);
                }
            }, "bench-waiter");
            waiting.setDaemon(true);
            waiting.start();
            if (queued != null) {
                Await.until("the waiter is queued", Duration.ofSeconds(10), queued);
            } else {
                Thread.sleep(300); // Redisson and Curator say nothing of their waiters: give them time
            }
            long killed = System.nanoTime();
            holder.destroyForcibly();
            return TimeUnit.NANOSECONDS.toMillis(granted.get(60, TimeUnit.SECONDS) - killed);
        } finally {
            holder.destroyForcibly();
            holder.waitFor();
        }
    }
}
