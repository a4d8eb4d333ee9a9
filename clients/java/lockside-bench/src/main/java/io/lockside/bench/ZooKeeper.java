package io.lockside.bench;

import io.lockside.testkit.Await;
import io.lockside.testkit.Ports;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.Comparator;
import java.util.stream.Stream;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.retry.ExponentialBackoffRetry;

/**
 * A standalone ZooKeeper (Debian's {@code zookeeper} package, /usr/share/java/zookeeper.jar)
 * on a free loopback port, in a temporary directory, killed on close; and the Curator
 * client the benchmark uses with it (session timeout 10 s: how long a dead holder's
 * ephemeral node, and so its lock, outlives it, as the sidecar's default TTL).
 */
final class ZooKeeper implements AutoCloseable {
    static final String JAR = "/usr/share/java/zookeeper.jar";
    static final int SESSION_TIMEOUT_MS = 10_000;

    private final Path dir;
    private final Process process;
    final String connect;

    private ZooKeeper(Path dir, Process process, String connect) {
        this.dir = dir;
        this.process = process;
        this.connect = connect;
    }

    static ZooKeeper start() throws IOException {
        if (!Files.exists(Path.of(JAR))) {
            throw new IllegalStateException(JAR + " is missing: apt-get install zookeeper (bench.sh does)");
        }
        Path dir = Files.createTempDirectory("lockside-bench-zk");
        int port = Ports.free();
        Path cfg = dir.resolve("zoo.cfg");
        // tickTime 1 s: sessions of 2 s to 20 s may be asked for (min/max are 2 and 20 ticks).
        Files.writeString(cfg, "tickTime=1000\ndataDir=" + dir.resolve("data") + "\nclientPort=" + port
                + "\nclientPortAddress=127.0.0.1\nadmin.enableServer=false\nmaxClientCnxns=0\n");
        Process p = new ProcessBuilder("java", "-Xmx256m", "-Dzookeeper.log.dir=" + dir, "-cp", JAR,
                "org.apache.zookeeper.server.ZooKeeperServerMain", cfg.toString())
                .redirectErrorStream(true).redirectOutput(dir.resolve("zookeeper.log").toFile()).start();
        ZooKeeper zk = new ZooKeeper(dir, p, "127.0.0.1:" + port);
        try {
            Await.until("ZooKeeper listens", Duration.ofSeconds(30), () -> Ports.listening(port));
        } catch (RuntimeException e) {
            zk.close();
            throw e;
        }
        return zk;
    }

    /** A started Curator client of `connect`. */
    static CuratorFramework curator(String connect) {
        CuratorFramework c = CuratorFrameworkFactory.builder().connectString(connect)
                .sessionTimeoutMs(SESSION_TIMEOUT_MS).connectionTimeoutMs(5000)
                .retryPolicy(new ExponentialBackoffRetry(50, 5)).build();
        c.start();
        try {
            if (!c.blockUntilConnected(30, java.util.concurrent.TimeUnit.SECONDS)) {
                throw new IllegalStateException("Curator did not connect to " + connect);
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IllegalStateException(e);
        }
        return c;
    }

    @Override
    public void close() {
        process.destroyForcibly();
        try {
            process.waitFor();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        try (Stream<Path> files = Files.walk(dir)) {
            files.sorted(Comparator.reverseOrder()).forEach(f -> f.toFile().delete());
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }
}
