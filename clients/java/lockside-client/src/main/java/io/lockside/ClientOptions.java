package io.lockside;

import java.time.Duration;
import java.util.Objects;

/**
 * How {@link LocksideClient#connect(ClientOptions)} connects. Immutable: every setter
 * returns a changed copy.
 *
 * <pre>{@code
 * LocksideClient.connect(ClientOptions.defaults()
 *         .clientName("billing-worker")
 *         .waitForSidecar(Duration.ofSeconds(30)));
 * }</pre>
 */
public final class ClientOptions {
    /** Where the sidecar listens unless told otherwise (its own default). */
    public static final String DEFAULT_ADDRESS = "127.0.0.1:7420";
    /** The environment variable that names the sidecar's address. */
    public static final String ADDRESS_ENV = "LOCKSIDE_ADDR";

    private final String address;
    private final String clientName;
    private final Duration waitForSidecar;
    private final Duration connectTimeout;
    private final LockListener listener;

    private ClientOptions(String address, String clientName, Duration waitForSidecar, Duration connectTimeout,
            LockListener listener) {
        this.address = address;
        this.clientName = clientName;
        this.waitForSidecar = waitForSidecar;
        this.connectTimeout = connectTimeout;
        this.listener = listener;
    }

    /** {@code $LOCKSIDE_ADDR} (else 127.0.0.1:7420), no name, fail fast, no listener. */
    public static ClientOptions defaults() {
        String env = System.getenv(ADDRESS_ENV);
        return new ClientOptions(env == null || env.isEmpty() ? DEFAULT_ADDRESS : env, "", Duration.ZERO,
                Duration.ofSeconds(10), null);
    }

    /** {@code host:port}, {@code http://host:port} or {@code unix:/path/to.sock}. */
    public ClientOptions address(String address) {
        Objects.requireNonNull(address, "address");
        return new ClientOptions(address, clientName, waitForSidecar, connectTimeout, listener);
    }

    /** Sent as {@code lockside-client-name}: how {@code describe} shows this client. */
    public ClientOptions clientName(String clientName) {
        Objects.requireNonNull(clientName, "clientName");
        return new ClientOptions(address, clientName, waitForSidecar, connectTimeout, listener);
    }

    /**
     * How long {@code connect} waits for a sidecar that does not listen yet (a pod whose
     * sidecar starts after the app). Zero, the default: fail at once, naming the address.
     */
    public ClientOptions waitForSidecar(Duration wait) {
        if (wait.isNegative()) {
            throw new IllegalArgumentException("waitForSidecar must not be negative");
        }
        return new ClientOptions(address, clientName, wait, connectTimeout, listener);
    }

    /** How long {@code connect} waits for a sidecar that accepts the connection to answer. */
    public ClientOptions connectTimeout(Duration timeout) {
        if (timeout.isNegative() || timeout.isZero()) {
            throw new IllegalArgumentException("connectTimeout must be positive");
        }
        return new ClientOptions(address, clientName, waitForSidecar, timeout, listener);
    }

    /** Told when held locks are suspended, restored or lost. */
    public ClientOptions listener(LockListener listener) {
        return new ClientOptions(address, clientName, waitForSidecar, connectTimeout, listener);
    }

    public String address() {
        return address;
    }

    public String clientName() {
        return clientName;
    }

    public Duration waitForSidecar() {
        return waitForSidecar;
    }

    public Duration connectTimeout() {
        return connectTimeout;
    }

    /** The listener, or null. */
    public LockListener listener() {
        return listener;
    }
}
