package io.lockside.boot;

import static org.assertj.core.api.Assertions.assertThat;

import io.lockside.LocksideClient;
import io.lockside.LocksideUnavailableException;
import io.lockside.SessionState;
import io.lockside.shedlock.LocksideLockProvider;
import io.lockside.spring.LocksideDistributedLock;
import io.lockside.spring.LocksideLockRegistry;
import io.lockside.testkit.Ports;
import io.lockside.testkit.RedisServer;
import io.lockside.testkit.Sidecar;
import io.micrometer.core.instrument.MeterRegistry;
import io.micrometer.core.instrument.simple.SimpleMeterRegistry;
import java.time.Duration;
import net.javacrumbs.shedlock.core.LockProvider;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.springframework.boot.autoconfigure.AutoConfigurations;
import org.springframework.boot.health.contributor.HealthIndicator;
import org.springframework.boot.health.contributor.Status;
import org.springframework.boot.test.context.FilteredClassLoader;
import org.springframework.boot.test.context.runner.ApplicationContextRunner;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Configuration;
import org.springframework.integration.support.locks.DefaultLockRegistry;
import org.springframework.integration.support.locks.LockRegistry;

/** What the starter configures, against a real sidecar (memory store). */
@Timeout(60)
class LocksideAutoConfigurationTest {
    static Sidecar sidecar;

    @BeforeAll
    static void start() {
        sidecar = Sidecar.memory();
    }

    @AfterAll
    static void stop() {
        sidecar.close();
    }

    private ApplicationContextRunner runner() {
        return new ApplicationContextRunner()
                .withConfiguration(AutoConfigurations.of(LocksideMetricsConfiguration.class,
                        LocksideAutoConfiguration.class, LocksideHealthConfiguration.class))
                .withPropertyValues("lockside.address=" + sidecar.address());
    }

    @Test
    void aClientARegistryAProviderAndHealthAreConfiguredAndTheClientClosesWithTheContext() {
        LocksideClient[] seen = new LocksideClient[1];
        runner().withPropertyValues("spring.application.name=billing").run(context -> {
            assertThat(context).hasSingleBean(LocksideClient.class);
            assertThat(context).hasSingleBean(LocksideLockRegistry.class);
            assertThat(context.getBean(LockProvider.class)).isInstanceOf(LocksideLockProvider.class);
            LocksideClient client = context.getBean(LocksideClient.class);
            seen[0] = client;
            LocksideLockRegistry registry = context.getBean(LocksideLockRegistry.class);
            LocksideDistributedLock lock = registry.obtain("starter-1");
            lock.lock();
            try {
                assertThat(client.describe("starter-1").holders().get(0).clientName())
                        .as("the client is named after the application").isEqualTo("billing");
            } finally {
                lock.unlock();
            }
            HealthIndicator health = context.getBean("locksideHealthIndicator", HealthIndicator.class);
            assertThat(health.health().getStatus()).isEqualTo(Status.UP);
            assertThat(health.health().getDetails()).containsEntry("state", "open");
        });
        assertThat(seen[0].sessionState()).isEqualTo(SessionState.CLOSED);
    }

    @Test
    void propertiesSetTheClientNameAndTheRegistrysPrefixAndLease() {
        runner().withPropertyValues("lockside.client-name=worker-7", "lockside.lock-registry.key-prefix=app:",
                "lockside.lock-registry.expire-after=30s", "lockside.wait-for-sidecar=2s").run(context -> {
                    LocksideLockRegistry registry = context.getBean(LocksideLockRegistry.class);
                    assertThat(registry.getExpireAfter()).isEqualTo(Duration.ofSeconds(30));
                    LocksideDistributedLock lock = registry.obtain("k");
                    lock.lock();
                    try {
                        assertThat(lock.key()).isEqualTo("app:k");
                        assertThat(context.getBean(LocksideClient.class).describe("app:k").holders().get(0)
                                .clientName()).isEqualTo("worker-7");
                    } finally {
                        lock.unlock();
                    }
                });
    }

    @Test
    void withoutShedLockOnTheClasspathThereIsNoLockProvider() {
        runner().withClassLoader(new FilteredClassLoader(LockProvider.class)).run(context -> {
            assertThat(context).hasNotFailed();
            assertThat(context).doesNotHaveBean(LocksideLockProvider.class);
            assertThat(context).hasSingleBean(LocksideLockRegistry.class);
        });
    }

    @Configuration(proxyBeanMethods = false)
    static class OwnBeans {
        @Bean
        LockRegistry<?> myRegistry() {
            return new DefaultLockRegistry();
        }

        @Bean
        MeterRegistry meterRegistry() {
            return new SimpleMeterRegistry();
        }
    }

    @Test
    void theApplicationsOwnRegistryWinsAndMetersCountWaitsHoldsAndLosses() {
        runner().withUserConfiguration(OwnBeans.class).run(context -> {
            assertThat(context).doesNotHaveBean(LocksideLockRegistry.class);
            assertThat(context.getBean(LockRegistry.class)).isInstanceOf(DefaultLockRegistry.class);
            LocksideClient client = context.getBean(LocksideClient.class);
            MeterRegistry meters = context.getBean(MeterRegistry.class);
            context.getBean(io.micrometer.core.instrument.binder.MeterBinder.class).bindTo(meters);
            var lock = client.lock("metered");
            lock.lock();
            assertThat(meters.get("lockside.locks.held").gauge().value()).isEqualTo(1.0);
            lock.unlock();
            client.lock("metered-and-lost").lock();
            client.close(); // a lock still held counts as lost
            awaitCount(meters, "lockside.lock.lost", 1);
            assertThat(meters.get("lockside.lock.wait").timer().count()).isEqualTo(2);
            assertThat(meters.get("lockside.lock.held").timer().count()).isEqualTo(1);
            assertThat(meters.get("lockside.locks.held").gauge().value()).isEqualTo(0.0);
        });
    }

    private static void awaitCount(MeterRegistry meters, String name, double count) {
        io.lockside.testkit.Await.until(name + " counted", Duration.ofSeconds(10),
                () -> meters.find(name).counter() != null && meters.get(name).counter().count() == count);
    }

    @Test
    void healthIsOutOfServiceWhileTheSessionResumesAndUpWhenItIsBack() {
        try (RedisServer redis = RedisServer.start();
                Sidecar own = Sidecar.start(redis.url(), "--attachment-ttl", "600ms")) {
            runner().withPropertyValues("lockside.address=" + own.address()).run(context -> {
                LocksideClient client = context.getBean(LocksideClient.class);
                HealthIndicator health = context.getBean("locksideHealthIndicator", HealthIndicator.class);
                var lock = client.lock("health", io.lockside.LockOptions.defaults().ttl(Duration.ofSeconds(10)));
                lock.lock();
                io.lockside.testkit.Await.until("the session's record lists the lock", Duration.ofSeconds(5),
                        () -> redis.recorded(client.sessionId(), 1));
                own.kill();
                io.lockside.testkit.Await.until("resuming", Duration.ofSeconds(5),
                        () -> health.health().getStatus().equals(Status.OUT_OF_SERVICE));
                assertThat(health.health().getDetails()).containsEntry("state", "resuming")
                        .containsEntry("suspendedLocks", 1);
                own.restart();
                io.lockside.testkit.Await.until("resumed", Duration.ofSeconds(10),
                        () -> health.health().getStatus().equals(Status.UP));
                assertThat(health.health().getDetails()).containsEntry("suspendedLocks", 0)
                        .containsEntry("heldLocks", 1);
                lock.unlock();
            });
        }
    }

    @Test
    void anApplicationWithoutItsSidecarFailsToStartNamingTheAddress() {
        String nowhere = "127.0.0.1:" + Ports.free();
        new ApplicationContextRunner()
                .withConfiguration(AutoConfigurations.of(LocksideAutoConfiguration.class))
                .withPropertyValues("lockside.address=" + nowhere).run(context -> {
                    assertThat(context).hasFailed();
                    Throwable t = context.getStartupFailure();
                    while (t != null && !(t instanceof LocksideUnavailableException)) {
                        t = t.getCause();
                    }
                    assertThat(t).as("the client's own error").isNotNull().hasMessageContaining(nowhere)
                            .hasMessageContaining("nothing listens there");
                });
    }
}
