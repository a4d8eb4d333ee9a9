package io.lockside.boot;

import static org.assertj.core.api.Assertions.assertThat;

import io.lockside.testkit.Await;
import io.lockside.testkit.Sidecar;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import net.javacrumbs.shedlock.spring.annotation.EnableSchedulerLock;
import net.javacrumbs.shedlock.spring.annotation.SchedulerLock;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.springframework.boot.WebApplicationType;
import org.springframework.boot.autoconfigure.EnableAutoConfiguration;
import org.springframework.boot.builder.SpringApplicationBuilder;
import org.springframework.context.ConfigurableApplicationContext;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Configuration;
import org.springframework.scheduling.annotation.EnableScheduling;
import org.springframework.scheduling.annotation.Scheduled;

/**
 * A real Spring Boot application, twice, on one sidecar: a {@code @Scheduled
 * @SchedulerLock} job with no lock code of its own runs once per tick across both.
 */
@Timeout(90)
class SchedulerLockAppTest {
    /** Every run of the job: the 2-second tick it ran in, and which instance ran it. */
    static final Map<Long, List<String>> RUNS = new TreeMap<>();

    @Configuration(proxyBeanMethods = false)
    @EnableAutoConfiguration
    @EnableScheduling
    @EnableSchedulerLock(defaultLockAtMostFor = "10s")
    static class App {
        @Bean
        Job job(org.springframework.core.env.Environment env) {
            return new Job(env.getProperty("spring.application.name"));
        }
    }

    static class Job {
        private final String instance;

        Job(String instance) {
            this.instance = instance;
        }

        /** Every 2 s; held at least 1.5 s, so a twin whose trigger is late by up to that still skips. */
        @Scheduled(cron = "*/2 * * * * *")
        @SchedulerLock(name = "report", lockAtLeastFor = "1500ms")
        public void run() {
            long tick = System.currentTimeMillis() / 2000;
            synchronized (RUNS) {
                RUNS.computeIfAbsent(tick, t -> new ArrayList<>()).add(instance);
            }
        }
    }

    private static ConfigurableApplicationContext start(Sidecar sidecar, String name) {
        return new SpringApplicationBuilder(App.class).web(WebApplicationType.NONE)
                .properties("lockside.address=" + sidecar.address(), "spring.application.name=" + name,
                        "spring.main.banner-mode=off")
                .run();
    }

    @Test
    void aScheduledJobOfTwoInstancesRunsOncePerTick() {
        try (Sidecar sidecar = Sidecar.memory();
                ConfigurableApplicationContext one = start(sidecar, "instance-1");
                ConfigurableApplicationContext two = start(sidecar, "instance-2")) {
            long bothUp = System.currentTimeMillis() / 2000 + 1;
            Await.until("four ticks with both instances up", Duration.ofSeconds(40), () -> {
                synchronized (RUNS) {
                    return RUNS.keySet().stream().filter(t -> t > bothUp).count() >= 4;
                }
            });
            one.close();
            two.close();
            synchronized (RUNS) {
                Map<Long, List<String>> seen = new TreeMap<>(RUNS);
                seen.keySet().removeIf(t -> t <= bothUp);
                long first = seen.keySet().iterator().next();
                long last = first + seen.size() - 1;
                for (long t = first; t <= last; t++) {
                    assertThat(seen.get(t)).as("runs of tick %d (all: %s)", t, seen).hasSize(1);
                }
            }
        }
    }
}
