package io.lockside.testkit;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;

/**
 * The real `lockside serve` binary ({@code $LOCKSIDE_BIN}) on a free loopback port, so
 * that tests can SIGKILL, freeze and restart it on the same address. {@link #close()}
 * kills it.
 */
public final class Sidecar implements AutoCloseable {
    /** The environment variable naming the sidecar binary the tests run. */
    public static final String BIN_ENV = "LOCKSIDE_BIN";

    private final String binary;
    private final List<String> args;
    private final int port;
    private final Path log;
    /** The Unix socket it listens on instead of the port, or null. */
    private Path socket;
    private Process process;
    private int starts;

    private Sidecar(String binary, List<String> args, int port, Path log) {
        this.binary = binary;
        this.args = args;
        this.port = port;
        this.log = log;
    }

    /**
     * The sidecar binary from {@code $LOCKSIDE_BIN}. Unset is an error, not a reason to
     * skip: these tests are what proves the client against a real sidecar.
     */
    public static String binary() {
        String bin = System.getenv(BIN_ENV);
        if (bin == null || bin.isEmpty()) {
            throw new IllegalStateException(
                    BIN_ENV + " is not set: point it at a `lockside` binary (e.g. target/debug/lockside "
                            + "of the repository, built with `cargo build`)");
        }
        if (!Files.isExecutable(Path.of(bin))) {
            throw new IllegalStateException(BIN_ENV + "=" + bin + " is not an executable file");
        }
        return bin;
    }

    /** A sidecar on the embedded memory store. */
    public static Sidecar memory(String... extra) {
        return start("memory", extra);
    }

    /** A sidecar on `store` (e.g. {@link RedisServer#url()}), with extra `serve` flags. */
    public static Sidecar start(String store, String... extra) {
        String bin = binary();
        IllegalStateException last = null;
        for (int attempt = 0; attempt < 5; attempt++) {
            int port = Ports.free();
            List<String> args = new ArrayList<>(List.of(
                    "serve", "--listen", "127.0.0.1:" + port, "--admin-listen", "none", "--store", store));
            args.addAll(List.of(extra));
            try {
                Sidecar s = new Sidecar(bin, args, port, Files.createTempFile("lockside-sidecar-", ".log"));
                if (s.launch()) {
                    return s;
                }
                last = new IllegalStateException("the sidecar did not start on port " + port + ":\n" + s.logTail());
            } catch (IOException e) {
                throw new UncheckedIOException(e);
            }
        }
        throw last;
    }

    /**
     * A sidecar on a given port (for a client that was told to wait for it there); fails
     * when the port is taken.
     */
    public static Sidecar onPort(int port, String store, String... extra) {
        List<String> args = new ArrayList<>(List.of(
                "serve", "--listen", "127.0.0.1:" + port, "--admin-listen", "none", "--store", store));
        args.addAll(List.of(extra));
        try {
            Sidecar s = new Sidecar(binary(), args, port, Files.createTempFile("lockside-sidecar-", ".log"));
            if (!s.launch()) {
                throw new IllegalStateException("the sidecar did not start on port " + port + ":\n" + s.logTail());
            }
            return s;
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    /** A sidecar on a Unix socket at `socket` (which must not exist yet). */
    public static Sidecar onUnixSocket(Path socket, String store) {
        List<String> args = new ArrayList<>(List.of(
                "serve", "--listen", "unix:" + socket, "--admin-listen", "none", "--store", store));
        try {
            Sidecar s = new Sidecar(binary(), args, 0, Files.createTempFile("lockside-sidecar-", ".log"));
            s.socket = socket;
            if (!s.launch()) {
                throw new IllegalStateException("the sidecar did not start on " + socket + ":\n" + s.logTail());
            }
            return s;
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    /** Starts the process and waits until it listens; false when it exited first. */
    private boolean launch() {
        try {
            List<String> command = new ArrayList<>();
            command.add(binary);
            command.addAll(args);
            ProcessBuilder pb = new ProcessBuilder(command);
            pb.environment().putIfAbsent("RUST_LOG", "info");
            process = Processes.start(pb.redirectErrorStream(true)
                    .redirectOutput(ProcessBuilder.Redirect.appendTo(log.toFile())));
            starts++;
            long until = System.nanoTime() + 15_000_000_000L;
            while (System.nanoTime() < until) {
                if (!process.isAlive()) {
                    return false;
                }
                if (socket != null ? Files.exists(socket) : Ports.listening(port)) {
                    return true;
                }
                Thread.sleep(5); // polling: the process gives no other sign that it listens
            }
            Processes.kill(process);
            return false;
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IllegalStateException(e);
        }
    }

    /** host:port (or unix:/path), as clients take it. */
    public String address() {
        return socket != null ? "unix:" + socket : "127.0.0.1:" + port;
    }

    public int port() {
        return port;
    }

    public long pid() {
        return process.pid();
    }

    /** SIGKILL: the sidecar dies without releasing anything. */
    public void kill() {
        Processes.kill(process);
    }

    /** SIGTERM: a clean stop (every lock released, `Lost` sent). */
    public void stop() {
        Processes.stop(process);
    }

    /** SIGSTOP. */
    public void freeze() {
        Processes.signal(process, "STOP");
    }

    /** SIGCONT. */
    public void thaw() {
        Processes.signal(process, "CONT");
    }

    /**
     * Starts the same sidecar again on the same address (after {@link #kill()}),
     * retrying while the port is not yet free.
     */
    public void restart() {
        if (process.isAlive()) {
            throw new IllegalStateException("the sidecar still runs");
        }
        long until = System.nanoTime() + 10_000_000_000L;
        while (!launch()) {
            if (System.nanoTime() > until) {
                throw new IllegalStateException("the sidecar did not start again on port " + port + ":\n" + logTail());
            }
        }
    }

    /** How many times the process was started. */
    public int starts() {
        return starts;
    }

    public String logTail() {
        return Processes.tail(log, 30);
    }

    @Override
    public void close() {
        if (process != null) {
            Processes.kill(process);
        }
        try {
            Files.deleteIfExists(log);
        } catch (IOException ignored) {
            // a temporary log left behind is not worth failing a test
        }
    }
}
