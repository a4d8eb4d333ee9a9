package io.lockside.boot;

import io.lockside.LocksideClient;
import io.lockside.SessionState;
import org.springframework.boot.autoconfigure.AutoConfiguration;
import org.springframework.boot.autoconfigure.condition.ConditionalOnBean;
import org.springframework.boot.autoconfigure.condition.ConditionalOnClass;
import org.springframework.boot.autoconfigure.condition.ConditionalOnMissingBean;
import org.springframework.boot.health.contributor.Health;
import org.springframework.boot.health.contributor.HealthIndicator;
import org.springframework.boot.health.contributor.Status;
import org.springframework.context.annotation.Bean;

/**
 * The Actuator health of the Lockside session ({@code /actuator/health/lockside}): UP
 * while it is open; OUT_OF_SERVICE while it is being resumed after a broken stream (its
 * locks are suspended); DOWN when there is none (the next lock opens one) or the client
 * is closed. Details: the state, the address, held and suspended locks.
 */
@AutoConfiguration(after = LocksideAutoConfiguration.class)
@ConditionalOnClass(HealthIndicator.class)
public class LocksideHealthConfiguration {

    @Bean(name = "locksideHealthIndicator")
    @ConditionalOnBean(LocksideClient.class)
    @ConditionalOnMissingBean(name = "locksideHealthIndicator")
    HealthIndicator locksideHealthIndicator(LocksideClient client) {
        return () -> {
            SessionState state = client.sessionState();
            Status status = switch (state) {
                case OPEN, CONNECTING -> Status.UP;
                case RESUMING -> Status.OUT_OF_SERVICE;
                case ENDED, CLOSED -> Status.DOWN;
            };
            return Health.status(status)
                    .withDetail("state", state.name().toLowerCase(java.util.Locale.ROOT))
                    .withDetail("address", client.address())
                    .withDetail("heldLocks", client.heldLocks())
                    .withDetail("suspendedLocks", client.suspendedLocks())
                    .build();
        };
    }
}
