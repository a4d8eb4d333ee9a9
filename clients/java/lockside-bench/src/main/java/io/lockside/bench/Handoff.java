package io.lockside.bench;

import io.lockside.LockOptions;
import io.lockside.LocksideClient;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.locks.Lock;
import org.redisson.api.RedissonClient;

/**
 * Handoff between 8 threads in two processes: two child JVMs, 4 threads each, all
 * contending for one key in a loop (lock, a ~10 us busy critical section, unlock) for a
 * fixed number of seconds. Each child stamps every cycle with wall-clock time, in
 * nanoseconds since the Unix epoch from {@code Instant.now()} (CLOCK_REALTIME, one clock
 * for both JVMs of this machine; System.nanoTime is per-JVM): when the thread asked
 * (req), was granted (grant) and called unlock() (unlock). The parent merges both
 * children's cycles in grant order and reports:
 * <ul>
 *   <li>handoff latency: a holder's unlock() call to the next holder's grant, over all
 *       handoffs and over those to another thread;</li>
 *   <li>self-reacquire: of the handoffs where another thread (another process) was
 *       already waiting when the holder called unlock(), the share that went back to the
 *       same thread (the same process).</li>
 * </ul>
 * The child: {@code Handoff child VARIANT TARGET KEY PROC}; it prints READY, waits for
 * "GO deadline-epoch-ms" on stdin, then prints one "E proc thread req grant unlock" line
 * per cycle and DONE.
 */
public final class Handoff {
    static final int PROCESSES = 2;
    static final int THREADS = 4;
    static final String[] VARIANTS = {"lockside", "lockside-fair", "redisson", "redisson-fair", "curator"};

    record Cycle(int proc, int thread, long req, long grant, long unlock) {}

    /** Runs every variant for `seconds` each and prints one table. */
    static void run(String sidecar, String redisUrl, String zookeeper, int seconds) throws Exception {
        System.out.printf("handoff: %d processes x %d threads on one key, %d s per variant, "
                + "critical section ~10 us; wall clock (Instant.now, ns since epoch)%n", PROCESSES, THREADS, seconds);
        System.out.printf("  %-15s %7s %7s | %-22s | %-22s | %9s %9s | %s%n", "", "grants", "/s",
                "handoff all p50/p99 ms", "to another p50/p99/max", "same thr", "same proc", "grants per thread min..max");
        for (String variant : VARIANTS) {
            String target = variant.startsWith("lockside") ? sidecar
                    : variant.equals("curator") ? zookeeper : redisUrl;
            List<Cycle> cycles = measure(variant, target, "bench/handoff-" + variant, seconds);
            report(variant, cycles, seconds);
        }
    }

    static List<Cycle> measure(String variant, String target, String key, int seconds) throws Exception {
        List<Process> children = new ArrayList<>();
        try {
            for (int p = 0; p < PROCESSES; p++) {
                children.add(new ProcessBuilder(ProcessHandle.current().info().command().orElse("java"), "-cp",
                        System.getProperty("java.class.path"), Handoff.class.getName(), "child", variant, target, key,
                        Integer.toString(p)).redirectErrorStream(true).start());
            }
            List<BufferedReader> outs = new ArrayList<>();
            for (Process child : children) {
                BufferedReader out = new BufferedReader(new InputStreamReader(child.getInputStream(), StandardCharsets.UTF_8));
                for (String line; !"READY".equals(line = out.readLine()); ) {
                    if (line == null) {
                        throw new IllegalStateException(variant + ": a child ended before READY");
                    }
                }
                outs.add(out);
            }
            byte[] go = ("GO " + (System.currentTimeMillis() + seconds * 1000L) + "\n").getBytes(StandardCharsets.UTF_8);
            for (Process child : children) {
                OutputStream in = child.getOutputStream();
                in.write(go);
                in.flush();
            }
            List<CompletableFuture<List<Cycle>>> read = new ArrayList<>();
            for (BufferedReader out : outs) {
                read.add(CompletableFuture.supplyAsync(() -> readCycles(out)));
            }
            List<Cycle> all = new ArrayList<>();
            for (CompletableFuture<List<Cycle>> r : read) {
                all.addAll(r.get());
            }
            all.sort(Comparator.comparingLong(Cycle::grant));
            return all;
        } finally {
            for (Process child : children) {
                child.destroyForcibly();
                child.waitFor();
            }
        }
    }

    static List<Cycle> readCycles(BufferedReader out) {
        List<Cycle> cycles = new ArrayList<>();
        try {
            for (String line; !"DONE".equals(line = out.readLine()); ) {
                if (line == null) {
                    throw new IllegalStateException("a child ended before DONE");
                }
                if (line.startsWith("E ")) {
                    String[] f = line.split(" ");
                    cycles.add(new Cycle(Integer.parseInt(f[1]), Integer.parseInt(f[2]), Long.parseLong(f[3]),
                            Long.parseLong(f[4]), Long.parseLong(f[5])));
                }
            }
        } catch (java.io.IOException e) {
            throw new java.io.UncheckedIOException(e);
        }
        return cycles;
    }

    static void report(String variant, List<Cycle> c, int seconds) {
        long[] all = new long[c.size() - 1];
        List<Long> toOther = new ArrayList<>();
        int waitedThread = 0, sameThread = 0, waitedProc = 0, sameProc = 0;
        for (int i = 0; i + 1 < c.size(); i++) {
            Cycle from = c.get(i), to = c.get(i + 1);
            all[i] = to.grant() - from.unlock();
            int self = from.proc() * THREADS + from.thread();
            if (to.proc() * THREADS + to.thread() != self) {
                toOther.add(all[i]);
            }
            // Who was waiting when `from` called unlock(): each thread's next cycle after
            // i, if it had asked by then (each thread has one request at a time).
            boolean[] seen = new boolean[PROCESSES * THREADS];
            boolean otherThread = false, otherProc = false;
            for (int j = i + 1, left = seen.length; j < c.size() && left > 0; j++) {
                Cycle w = c.get(j);
                int t = w.proc() * THREADS + w.thread();
                if (seen[t]) {
                    continue;
                }
                seen[t] = true;
                left--;
                if (t != self && w.req() < from.unlock()) {
                    otherThread = true;
                    otherProc |= w.proc() != from.proc();
                }
            }
            if (otherThread) {
                waitedThread++;
                sameThread += to.proc() * THREADS + to.thread() == self ? 1 : 0;
            }
            if (otherProc) {
                waitedProc++;
                sameProc += to.proc() == from.proc() ? 1 : 0;
            }
        }
        int[] perThread = new int[PROCESSES * THREADS];
        c.forEach(x -> perThread[x.proc() * THREADS + x.thread()]++);
        Arrays.sort(perThread);
        long[] other = toOther.stream().mapToLong(Long::longValue).toArray();
        System.out.printf("  %-15s %7d %7d | %9s / %9s   | %s | %8.1f%% %8.1f%% | %d..%d%n", variant, c.size(),
                c.size() / seconds, ms(all, 0.50), ms(all, 0.99),
                ms(other, 0.50) + " / " + ms(other, 0.99) + " / " + ms(other, 1.0),
                100.0 * sameThread / Math.max(1, waitedThread), 100.0 * sameProc / Math.max(1, waitedProc),
                perThread[0], perThread[perThread.length - 1]);
    }

    static String ms(long[] nanos, double q) {
        if (nanos.length == 0) {
            return "-";
        }
        long[] s = nanos.clone();
        Arrays.sort(s);
        return String.format("%.3f", s[Math.min(s.length - 1, (int) (q * s.length))] / 1e6);
    }

    static long now() {
        Instant t = Instant.now();
        return t.getEpochSecond() * 1_000_000_000L + t.getNano();
    }

    /** The child process: 4 threads, one lock, until the deadline the parent sends. */
    public static void main(String[] args) throws Exception {
        String variant = args[1], target = args[2], key = args[3];
        int proc = Integer.parseInt(args[4]);
        LocksideClient client = null;
        RedissonClient redisson = null;
        Lock lock;
        switch (variant) {
            case "lockside" -> lock = (client = LocksideClient.connect(target)).lock(key);
            case "lockside-fair" -> lock = (client = LocksideClient.connect(target)).lock(key,
                    LockOptions.defaults().fair(true));
            case "redisson" -> lock = (redisson = Bench.redisson(target)).getLock(key);
            case "redisson-fair" -> lock = (redisson = Bench.redisson(target)).getFairLock(key);
            case "curator" -> lock = new CuratorLock(ZooKeeper.curator(target), key);
            default -> throw new IllegalArgumentException(variant);
        }
        for (int i = 0; i < 200; i++) { // warm-up: connections, scripts, JIT
            lock.lock();
            lock.unlock();
        }
        System.out.println("READY");
        System.out.flush();
        String go = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8)).readLine();
        long deadline = Long.parseLong(go.split(" ")[1]) * 1_000_000L;
        List<List<long[]>> stamps = new ArrayList<>();
        List<Thread> threads = new ArrayList<>();
        for (int t = 0; t < THREADS; t++) {
            List<long[]> mine = new ArrayList<>();
            stamps.add(mine);
            Thread thread = new Thread(() -> {
                while (true) {
                    long req = now();
                    if (req >= deadline) {
                        return;
                    }
                    lock.lock();
                    long grant = now();
                    while (now() - grant < 10_000) {
                        Thread.onSpinWait(); // the critical section
                    }
                    long unlock = now();
                    lock.unlock();
                    mine.add(new long[] {req, grant, unlock});
                }
            });
            thread.start();
            threads.add(thread);
        }
        for (Thread t : threads) {
            t.join();
        }
        StringBuilder out = new StringBuilder();
        for (int t = 0; t < THREADS; t++) {
            for (long[] s : stamps.get(t)) {
                out.append("E ").append(proc).append(' ').append(t).append(' ').append(s[0]).append(' ')
                        .append(s[1]).append(' ').append(s[2]).append('\n');
            }
        }
        out.append("DONE\n");
        System.out.print(out);
        System.out.flush();
        System.exit(0);
    }
}
