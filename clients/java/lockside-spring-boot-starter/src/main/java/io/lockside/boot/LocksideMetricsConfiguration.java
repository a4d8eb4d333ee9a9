package io.lockside.boot;

import io.lockside.LockEvent;
import io.lockside.LockListener;
import io.lockside.LocksideClient;
import io.micrometer.core.instrument.Counter;
import io.micrometer.core.instrument.Gauge;
import io.micrometer.core.instrument.MeterRegistry;
import io.micrometer.core.instrument.Timer;
import io.micrometer.core.instrument.binder.MeterBinder;
import java.time.Duration;
import org.springframework.beans.factory.ObjectProvider;
import org.springframework.boot.autoconfigure.AutoConfiguration;
import org.springframework.boot.autoconfigure.condition.ConditionalOnClass;
import org.springframework.context.annotation.Bean;

/**
 * Micrometer meters of the client's locks (names without keys: keys are unbounded):
 *
 * <ul>
 *   <li>{@code lockside.lock.wait} (timer): from asking to the grant, per grant;
 *   <li>{@code lockside.lock.held} (timer): from the grant to giving it back;
 *   <li>{@code lockside.lock.lost} (counter): grants lost while held;
 *   <li>{@code lockside.locks.held}, {@code lockside.locks.suspended} (gauges): now.
 * </ul>
 */
@AutoConfiguration(before = LocksideAutoConfiguration.class)
@ConditionalOnClass(MeterRegistry.class)
public class LocksideMetricsConfiguration {

    /** A listener of the client (so made before it), finding the registry on first use. */
    @Bean
    LocksideMeters locksideMeters(ObjectProvider<MeterRegistry> registry) {
        return new LocksideMeters(registry);
    }

    @Bean
    MeterBinder locksideGauges(LocksideClient client) {
        return registry -> {
            Gauge.builder("lockside.locks.held", client, LocksideClient::heldLocks)
                    .description("locks this client holds now").register(registry);
            Gauge.builder("lockside.locks.suspended", client, LocksideClient::suspendedLocks)
                    .description("held locks suspended now (the stream to the sidecar broke)").register(registry);
        };
    }

    /** Records waits, holds and losses into the application's meter registry, if it has one. */
    public static final class LocksideMeters implements LockListener {
        private final ObjectProvider<MeterRegistry> registries;
        private volatile Meters meters;

        LocksideMeters(ObjectProvider<MeterRegistry> registries) {
            this.registries = registries;
        }

        private Meters meters() {
            Meters m = meters;
            if (m == null) {
                MeterRegistry r = registries.getIfAvailable();
                if (r == null) {
                    return null;
                }
                m = new Meters(r);
                meters = m;
            }
            return m;
        }

        @Override
        public void onAcquired(LockEvent lock, Duration waited) {
            Meters m = meters();
            if (m != null) {
                m.wait.record(waited);
            }
        }

        @Override
        public void onReleased(LockEvent lock, Duration held) {
            Meters m = meters();
            if (m != null) {
                m.held.record(held);
            }
        }

        @Override
        public void onLost(LockEvent lock, String reason) {
            Meters m = meters();
            if (m != null) {
                m.lost.increment();
            }
        }
    }

    private static final class Meters {
        final Timer wait;
        final Timer held;
        final Counter lost;

        Meters(MeterRegistry r) {
            wait = Timer.builder("lockside.lock.wait").description("from asking for a lock to its grant").register(r);
            held = Timer.builder("lockside.lock.held").description("from a grant to giving it back").register(r);
            lost = Counter.builder("lockside.lock.lost").description("grants lost while held").register(r);
        }
    }
}
