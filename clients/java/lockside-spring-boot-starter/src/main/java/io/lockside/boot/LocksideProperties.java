package io.lockside.boot;

import java.time.Duration;
import org.springframework.boot.context.properties.ConfigurationProperties;

/**
 * {@code lockside.*}: how the auto-configured {@link io.lockside.LocksideClient} connects,
 * and the lock registry's options.
 *
 * <pre>
 * lockside:
 *   address: 127.0.0.1:7420        # else $LOCKSIDE_ADDR, else 127.0.0.1:7420
 *   wait-for-sidecar: 30s          # a sidecar that starts after the application
 *   client-name: billing-worker    # else spring.application.name
 *   lock-registry:
 *     key-prefix: "billing:"
 *     expire-after: 30s            # a lease, as Spring's registries; unset: held while the session lives
 * </pre>
 */
@ConfigurationProperties("lockside")
public class LocksideProperties {
    /** The sidecar's address (host:port or unix:/path); unset: $LOCKSIDE_ADDR, else 127.0.0.1:7420. */
    private String address;
    /** How long connecting waits for a sidecar that does not listen yet; 0: fail at once. */
    private Duration waitForSidecar = Duration.ZERO;
    /** How the sidecar's describe shows this client; unset: spring.application.name. */
    private String clientName;
    private final Registry lockRegistry = new Registry();

    public String getAddress() {
        return address;
    }

    public void setAddress(String address) {
        this.address = address;
    }

    public Duration getWaitForSidecar() {
        return waitForSidecar;
    }

    public void setWaitForSidecar(Duration waitForSidecar) {
        this.waitForSidecar = waitForSidecar;
    }

    public String getClientName() {
        return clientName;
    }

    public void setClientName(String clientName) {
        this.clientName = clientName;
    }

    public Registry getLockRegistry() {
        return lockRegistry;
    }

    /** {@code lockside.lock-registry.*}: the {@link io.lockside.spring.LocksideLockRegistry} bean. */
    public static class Registry {
        /** Prepended to every key of the registry. */
        private String keyPrefix = "";
        /** The lease of locks taken without a TTL; unset: held for as long as the session lives. */
        private Duration expireAfter;

        public String getKeyPrefix() {
            return keyPrefix;
        }

        public void setKeyPrefix(String keyPrefix) {
            this.keyPrefix = keyPrefix;
        }

        public Duration getExpireAfter() {
            return expireAfter;
        }

        public void setExpireAfter(Duration expireAfter) {
            this.expireAfter = expireAfter;
        }
    }
}
