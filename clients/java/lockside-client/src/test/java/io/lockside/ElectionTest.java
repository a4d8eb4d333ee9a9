package io.lockside;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.lockside.testkit.SidecarExtension;
import java.time.Duration;
import java.util.Optional;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.RegisterExtension;

/** campaign, proclaim, describe and watch: leader election as followers see it. */
class ElectionTest {
    @RegisterExtension
    static final SidecarExtension<LocksideClient> sidecar = SidecarExtension.connecting(LocksideClient::connect);

    /** The next state whose leader differs from `value` (watch may send others between). */
    static Description leaderBecomes(LockWatch w, String value) throws InterruptedException {
        while (true) {
            Description d = w.next(Duration.ofSeconds(10)).orElseThrow(() -> new AssertionError("no state"));
            if (d.leader().map(Description.Holder::valueString).orElse("").equals(value)) {
                return d;
            }
        }
    }

    @Test
    void followersSeeTheLeaderItsNewValueAndTheNextLeaderWithALargerToken() throws Exception {
        String key = "election/orders";
        try (LocksideClient a = LocksideClient.connect(sidecar.address());
                LocksideClient b = LocksideClient.connect(sidecar.address());
                LocksideClient follower = LocksideClient.connect(sidecar.address());
                LockWatch watch = follower.watch(key)) {
            assertTrue(watch.next().holders().isEmpty(), "first the current state: no leader");

            Leadership first = a.campaign(key, "10.0.0.1:8080");
            Description d = leaderBecomes(watch, "10.0.0.1:8080");
            assertEquals(first.fencingToken(), d.leader().orElseThrow().fencingToken());
            assertEquals("10.0.0.1:8080", follower.describe(key).leader().orElseThrow().valueString());

            assertTrue(b.campaign(key, "10.0.0.2:8080", Duration.ofMillis(100)).isEmpty(), "one leader");
            CompletableFuture<Leadership> second = CompletableFuture.supplyAsync(() -> {
                try {
                    return b.campaign(key, "10.0.0.2:8080");
                } catch (InterruptedException e) {
                    throw new IllegalStateException(e);
                }
            });

            first.proclaim("10.0.0.1:9090");
            leaderBecomes(watch, "10.0.0.1:9090");

            first.close(); // resign
            Leadership next = second.get(10, TimeUnit.SECONDS);
            Description after = leaderBecomes(watch, "10.0.0.2:8080");
            assertTrue(after.leader().orElseThrow().fencingToken() > first.fencingToken(), "tokens increase");
            assertEquals(next.fencingToken(), after.leader().orElseThrow().fencingToken());
            next.close();
            Optional<Description> none = Optional.of(leaderBecomes(watch, ""));
            assertTrue(none.get().holders().isEmpty());
        }
    }

    @Test
    void aWatchOfABadKeyEndsWithTheRefusal() throws Exception {
        try (LocksideClient c = LocksideClient.connect(sidecar.address()); LockWatch w = c.watch("")) {
            LocksideRejectedException e =
                    org.junit.jupiter.api.Assertions.assertThrows(LocksideRejectedException.class, w::next);
            assertEquals("INVALID_ARGUMENT", e.codeName());
        }
    }
}
