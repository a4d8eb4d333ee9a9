package io.lockside;

import java.io.IOException;
import java.net.ConnectException;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.net.SocketAddress;
import java.net.SocketTimeoutException;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.channels.SocketChannel;
import java.time.Duration;
import java.util.concurrent.TimeUnit;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Whether anything listens at the sidecar's address, asked with a plain socket before
 * the gRPC channel is built: a connection refused is known in a millisecond, where a
 * first gRPC call takes a second to load its transport and say the same.
 */
final class Probe {
    private static final Logger LOG = LoggerFactory.getLogger("io.lockside");
    private static final long FIRST_BACKOFF_NANOS = TimeUnit.MILLISECONDS.toNanos(50);
    private static final long MAX_BACKOFF_NANOS = TimeUnit.MILLISECONDS.toNanos(500);
    private static final int CONNECT_TIMEOUT_MS = 1000;

    private Probe() {}

    /**
     * Returns once something accepts connections at the address (or the address is not
     * one a socket can try: gRPC decides then); waits up to {@code waitForSidecar},
     * logging one line when it starts waiting.
     *
     * @throws LocksideUnavailableException nothing listens there (after the wait, if any)
     */
    static void listening(ClientOptions options) {
        SocketAddress socket = socketOf(options.address());
        if (socket == null) {
            return;
        }
        Duration wait = options.waitForSidecar();
        long deadline = System.nanoTime() + wait.toNanos();
        long backoff = FIRST_BACKOFF_NANOS;
        boolean logged = false;
        while (true) {
            IOException refused = tryConnect(socket);
            if (refused == null) {
                if (logged) {
                    LOG.info("lockside: the sidecar at {} listens now", options.address());
                }
                return;
            }
            long left = deadline - System.nanoTime();
            if (left <= 0) {
                throw new LocksideUnavailableException(notListening(options, refused), refused);
            }
            if (!logged) {
                LOG.info("lockside: no sidecar listens at {} yet ({}); waiting up to {} s for it", options.address(),
                        why(refused), wait.toMillis() / 1000.0);
                logged = true;
            }
            try {
                TimeUnit.NANOSECONDS.sleep(Math.min(backoff, left)); // waiting for a process to start listening
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new LocksideUnavailableException(
                        "interrupted while waiting for the sidecar at " + options.address());
            }
            backoff = Math.min(backoff * 2, MAX_BACKOFF_NANOS);
        }
    }

    /** Why `connect` failed, saying only what the user has not done yet. */
    static String notListening(ClientOptions options, IOException refused) {
        return "no Lockside sidecar at " + options.address() + " (" + why(refused) + ")" + advice(options);
    }

    /** What to do about a sidecar that cannot be reached, less what the user did already. */
    static String advice(ClientOptions options) {
        StringBuilder b = new StringBuilder();
        if (!options.waitForSidecar().isZero()) {
            b.append(" after waiting ").append(options.waitForSidecar().toMillis() / 1000.0).append(" s for it");
        }
        b.append("; start the sidecar");
        String env = System.getenv(ClientOptions.ADDRESS_ENV);
        if ((env == null || env.isEmpty()) && options.address().equals(ClientOptions.DEFAULT_ADDRESS)) {
            b.append(", or set ").append(ClientOptions.ADDRESS_ENV).append(" to the address it listens at");
        }
        if (options.waitForSidecar().isZero()) {
            b.append(", or wait for one that starts after the application with ClientOptions.waitForSidecar");
        }
        return b.toString();
    }

    private static String why(IOException e) {
        if (e instanceof ConnectException) {
            return "connection refused: nothing listens there";
        }
        return e.getMessage() != null ? e.getMessage() : e.getClass().getSimpleName();
    }

    /**
     * Null when connecting worked (or took over a second: gRPC decides then); the failure
     * when nothing accepted the connection.
     */
    private static IOException tryConnect(SocketAddress socket) {
        try {
            if (socket instanceof UnixDomainSocketAddress) {
                try (SocketChannel ch = SocketChannel.open(StandardProtocolFamily.UNIX)) {
                    ch.connect(socket);
                }
            } else {
                try (Socket s = new Socket()) {
                    s.connect(socket, CONNECT_TIMEOUT_MS);
                }
            }
            return null;
        } catch (SocketTimeoutException e) {
            return null;
        } catch (IOException e) {
            // Refused, a missing socket file, no route: nothing listens there.
            return e;
        } catch (RuntimeException e) {
            return null; // not something a socket can try: gRPC decides
        }
    }

    /** The address as a socket address; null when it is not one (a DNS target, a scheme). */
    static SocketAddress socketOf(String address) {
        if (address.startsWith("unix:")) {
            String path = address.substring("unix:".length());
            while (path.startsWith("//")) {
                path = path.substring(1);
            }
            return UnixDomainSocketAddress.of(path);
        }
        String target = address.startsWith("http://") ? address.substring("http://".length()) : address;
        while (target.endsWith("/")) {
            target = target.substring(0, target.length() - 1);
        }
        String host;
        String port;
        if (target.startsWith("[")) {
            int end = target.indexOf("]:");
            if (end < 0) {
                return null;
            }
            host = target.substring(1, end);
            port = target.substring(end + 2);
        } else {
            int colon = target.lastIndexOf(':');
            if (colon <= 0 || target.indexOf(':') != colon || target.contains("/")) {
                return null;
            }
            host = target.substring(0, colon);
            port = target.substring(colon + 1);
        }
        try {
            InetSocketAddress a = new InetSocketAddress(host, Integer.parseInt(port));
            return a.isUnresolved() ? null : a;
        } catch (IllegalArgumentException e) {
            return null;
        }
    }
}
