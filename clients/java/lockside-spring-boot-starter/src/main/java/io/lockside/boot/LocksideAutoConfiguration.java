package io.lockside.boot;

import io.lockside.ClientOptions;
import io.lockside.LockListener;
import io.lockside.LocksideClient;
import io.lockside.shedlock.LocksideLockProvider;
import io.lockside.spring.LocksideLockRegistry;
import java.util.List;
import net.javacrumbs.shedlock.core.LockProvider;
import org.springframework.beans.factory.ObjectProvider;
import org.springframework.boot.autoconfigure.AutoConfiguration;
import org.springframework.boot.autoconfigure.condition.ConditionalOnClass;
import org.springframework.boot.autoconfigure.condition.ConditionalOnMissingBean;
import org.springframework.boot.context.properties.EnableConfigurationProperties;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Configuration;
import org.springframework.core.env.Environment;
import org.springframework.integration.support.locks.LockRegistry;

/**
 * The Lockside beans of a Spring Boot application: a {@link LocksideClient} (closed with
 * the context), a {@link LocksideLockRegistry}, and with ShedLock on the classpath a
 * ShedLock {@link LockProvider}, so that {@code @EnableSchedulerLock} and {@code
 * @SchedulerLock} need no code. Each backs off when the application defines its own.
 * Every {@link LockListener} bean hears the client's lock events (the Micrometer meters
 * are one, see {@link LocksideMetricsConfiguration}).
 */
@AutoConfiguration
@EnableConfigurationProperties(LocksideProperties.class)
public class LocksideAutoConfiguration {

    /** Connects at startup: an application without its sidecar fails to start, naming the address. */
    @Bean(destroyMethod = "close")
    @ConditionalOnMissingBean
    public LocksideClient locksideClient(LocksideProperties properties, Environment env,
            ObjectProvider<LockListener> listeners) {
        ClientOptions options = ClientOptions.defaults().waitForSidecar(properties.getWaitForSidecar());
        if (properties.getAddress() != null && !properties.getAddress().isBlank()) {
            options = options.address(properties.getAddress().trim());
        }
        String name = properties.getClientName() != null
                ? properties.getClientName() : env.getProperty("spring.application.name", "");
        options = options.clientName(name);
        List<LockListener> all = listeners.orderedStream().toList();
        if (!all.isEmpty()) {
            options = options.listener(new Listeners(all));
        }
        return LocksideClient.connect(options);
    }

    @Bean
    @ConditionalOnMissingBean(LockRegistry.class)
    public LocksideLockRegistry locksideLockRegistry(LocksideClient client, LocksideProperties properties) {
        LocksideProperties.Registry r = properties.getLockRegistry();
        return new LocksideLockRegistry(client, r.getKeyPrefix() == null ? "" : r.getKeyPrefix(), r.getExpireAfter());
    }

    /** ShedLock's provider, when ShedLock is on the classpath. */
    @Configuration(proxyBeanMethods = false)
    @ConditionalOnClass(name = "net.javacrumbs.shedlock.core.LockProvider")
    static class ShedLockConfiguration {
        @Bean
        @ConditionalOnMissingBean(LockProvider.class)
        LocksideLockProvider locksideLockProvider(LocksideClient client) {
            return new LocksideLockProvider(client);
        }
    }

    /** Every LockListener bean, called in order; one that throws does not stop the others. */
    static final class Listeners implements LockListener {
        private final List<LockListener> all;

        Listeners(List<LockListener> all) {
            this.all = all;
        }

        private void each(java.util.function.Consumer<LockListener> call) {
            RuntimeException first = null;
            for (LockListener l : all) {
                try {
                    call.accept(l);
                } catch (RuntimeException e) {
                    if (first == null) {
                        first = e;
                    }
                }
            }
            if (first != null) {
                throw first; // the client logs it
            }
        }

        @Override
        public void onSuspended(io.lockside.LockEvent lock) {
            each(l -> l.onSuspended(lock));
        }

        @Override
        public void onRestored(io.lockside.LockEvent lock) {
            each(l -> l.onRestored(lock));
        }

        @Override
        public void onLost(io.lockside.LockEvent lock, String reason) {
            each(l -> l.onLost(lock, reason));
        }

        @Override
        public void onAcquired(io.lockside.LockEvent lock, java.time.Duration waited) {
            each(l -> l.onAcquired(lock, waited));
        }

        @Override
        public void onReleased(io.lockside.LockEvent lock, java.time.Duration held) {
            each(l -> l.onReleased(lock, held));
        }
    }
}
