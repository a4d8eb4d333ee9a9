package io.lockside.testkit;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.io.UncheckedIOException;
import java.net.InetAddress;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;

/**
 * A `redis-server` on a free loopback port, without persistence, in a temporary
 * directory; stopped by {@link #close()}.
 */
public final class RedisServer implements AutoCloseable {
    private final Process process;
    private final int port;
    private final Path dir;

    private RedisServer(Process process, int port, Path dir) {
        this.process = process;
        this.port = port;
        this.dir = dir;
    }

    /** Starts one and waits until it answers PING (retrying on a port taken meanwhile). */
    public static RedisServer start() {
        IllegalStateException last = null;
        for (int attempt = 0; attempt < 5; attempt++) {
            int port = Ports.free();
            try {
                Path dir = Files.createTempDirectory("lockside-redis-");
                Path log = dir.resolve("redis.log");
                Process p = Processes.start(new ProcessBuilder(
                                "redis-server", "--port", Integer.toString(port),
                                "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                                "--dir", dir.toString())
                        .redirectErrorStream(true)
                        .redirectOutput(log.toFile()));
                RedisServer server = new RedisServer(p, port, dir);
                long until = System.nanoTime() + 10_000_000_000L;
                while (System.nanoTime() < until && p.isAlive()) {
                    if (server.ping()) {
                        return server;
                    }
                    Thread.sleep(10); // polling a process that gives no other sign of readiness
                }
                last = new IllegalStateException(
                        "redis-server on port " + port + " did not answer PING:\n" + Processes.tail(log, 20));
                Processes.kill(p);
            } catch (IOException e) {
                throw new UncheckedIOException("cannot start redis-server (is it installed?)", e);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new IllegalStateException(e);
            }
        }
        throw last;
    }

    public int port() {
        return port;
    }

    /** The sidecar's `--store` for this server. */
    public String url() {
        return "redis://127.0.0.1:" + port;
    }

    /** Whether the server answers PING. */
    public boolean ping() {
        return "+PONG".equals(command("PING"));
    }

    /**
     * Sends one inline command and returns the first line of the reply (e.g. "+PONG",
     * ":3", "$5" for a bulk string), or null when the server does not answer.
     */
    public String command(String inline) {
        try (Socket s = new Socket(InetAddress.getLoopbackAddress(), port)) {
            s.setSoTimeout(2000);
            OutputStream out = s.getOutputStream();
            out.write((inline + "\r\n").getBytes(StandardCharsets.UTF_8));
            out.flush();
            InputStream in = s.getInputStream();
            StringBuilder line = new StringBuilder();
            int c;
            while ((c = in.read()) != -1 && c != '\r') {
                line.append((char) c);
            }
            return line.toString();
        } catch (IOException e) {
            return null;
        }
    }

    /**
     * Whether the sidecar's record of session `sessionId` lists `keys` grants: its
     * journal writes a grant there once it has been held about 50 ms, and only what is
     * there can be resumed after the sidecar dies.
     */
    public boolean recorded(String sessionId, int keys) {
        return (":" + (3 + keys)).equals(command("HLEN {lockside:session/" + sessionId + "}:s"));
    }

    public Process process() {
        return process;
    }

    @Override
    public void close() {
        Processes.kill(process);
        try (var files = Files.walk(dir)) {
            files.sorted(java.util.Comparator.reverseOrder()).forEach(f -> f.toFile().delete());
        } catch (IOException ignored) {
            // a temporary directory left behind is not worth failing a test
        }
    }
}
