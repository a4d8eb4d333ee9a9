package io.lockside.testkit;

import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.function.Function;
import org.junit.jupiter.api.extension.AfterAllCallback;
import org.junit.jupiter.api.extension.AfterEachCallback;
import org.junit.jupiter.api.extension.BeforeAllCallback;
import org.junit.jupiter.api.extension.BeforeEachCallback;
import org.junit.jupiter.api.extension.ExtensionContext;

/**
 * The setup the tests of plain locking share: one sidecar on the memory store for the
 * test class, and for each test a client of it and a thread pool, made on first use
 * and closed after the test.
 *
 * <pre>{@code
 * @RegisterExtension
 * static final SidecarExtension<LocksideClient> sidecar = SidecarExtension.connecting(LocksideClient::connect);
 * }</pre>
 *
 * The kit cannot name the client (the client's own tests use the kit), so the test says
 * how to connect one to an address. Tests of a class run one at a time (JUnit's
 * default): the current test's client and pool are fields of the extension.
 */
public final class SidecarExtension<C extends AutoCloseable>
        implements BeforeAllCallback, AfterAllCallback, BeforeEachCallback, AfterEachCallback {
    private final Function<String, C> connect;
    private Sidecar sidecar;
    private String testName;
    private C client;
    private ExecutorService pool;

    private SidecarExtension(Function<String, C> connect) {
        this.connect = connect;
    }

    /** A memory-store sidecar per class; `connect` makes a client of an address. */
    public static <C extends AutoCloseable> SidecarExtension<C> connecting(Function<String, C> connect) {
        return new SidecarExtension<>(connect);
    }

    @Override
    public void beforeAll(ExtensionContext context) {
        sidecar = Sidecar.memory();
    }

    @Override
    public void afterAll(ExtensionContext context) {
        sidecar.close();
    }

    @Override
    public void beforeEach(ExtensionContext context) {
        testName = context.getRequiredTestMethod().getName();
    }

    @Override
    public void afterEach(ExtensionContext context) throws Exception {
        if (pool != null) {
            pool.shutdownNow();
            pool = null;
        }
        if (client != null) {
            client.close();
            client = null;
        }
    }

    /** The sidecar's address, for clients of a test's own. */
    public String address() {
        return sidecar.address();
    }

    /** The current test's method name: a key no other test of the class uses. */
    public String testName() {
        return testName;
    }

    /** The current test's client of the sidecar (closed after the test; closing it early is fine). */
    public C client() {
        if (client == null) {
            client = connect.apply(sidecar.address());
        }
        return client;
    }

    /** The current test's thread pool (cached threads), shut down now after the test. */
    public ExecutorService pool() {
        if (pool == null) {
            pool = Executors.newCachedThreadPool();
        }
        return pool;
    }
}
