package io.lockside.testkit;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;

/** Free loopback ports, and whether something listens on one. */
public final class Ports {
    private Ports() {}

    /**
     * A port nothing listens on right now: bound on 127.0.0.1:0, read, closed. Another
     * process may take it before the server does, so servers started on it retry on a
     * bind failure.
     */
    public static int free() {
        try (ServerSocket s = new ServerSocket(0, 1, InetAddress.getLoopbackAddress())) {
            return s.getLocalPort();
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    /** Whether a TCP connection to 127.0.0.1:port is accepted. */
    public static boolean listening(int port) {
        try (Socket s = new Socket()) {
            s.connect(new InetSocketAddress(InetAddress.getLoopbackAddress(), port), 200);
            return true;
        } catch (IOException e) {
            return false;
        }
    }
}
