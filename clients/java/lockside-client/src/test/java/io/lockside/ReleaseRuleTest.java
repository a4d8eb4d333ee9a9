package io.lockside;

import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.lockside.testkit.RedisServer;
import io.lockside.testkit.Sidecar;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/**
 * The release rule (issue 35): unlock() returns once its Release is on the stream, not
 * when the sidecar answers, and what the process asks of the key afterwards is ordered
 * after that release.
 */
class ReleaseRuleTest {
    @Test
    void unlockReturnsWhileTheSidecarCannotAnswer() throws Exception {
        try (Sidecar sidecar = Sidecar.memory(); LocksideClient client = LocksideClient.connect(sidecar.address())) {
            LocksideLock lock = client.lock("release/sent");
            lock.lock();
            sidecar.freeze();
            long took;
            try {
                long started = System.nanoTime();
                lock.unlock();
                took = System.nanoTime() - started;
            } finally {
                sidecar.thaw();
            }
            // (The client's keepalive would break the stream after about 2 s.)
            assertTrue(took < TimeUnit.MILLISECONDS.toNanos(300),
                    "unlock took " + took / 1_000_000 + " ms: it waited for the frozen sidecar's answer");
            assertFalse(lock.isHeldByCurrentThread());
            assertTrue(client.describe("release/sent").holders().isEmpty(), "answered after the thaw");
        }
    }

    @Test
    void anotherClientsTryLockRightAfterAnUnlockFindsTheKeyFree() throws Exception {
        // b on another sidecar of the same store: nothing orders its acquire after a's
        // release but the client's own rule.
        try (RedisServer redis = RedisServer.start();
                Sidecar sidecar = Sidecar.start(redis.url());
                Sidecar another = Sidecar.start(redis.url());
                LocksideClient a = LocksideClient.connect(sidecar.address());
                LocksideClient b = LocksideClient.connect(another.address())) {
            for (int round = 0; round < 60; round++) {
                String key = "release/ordered/" + (round % 3);
                LocksideLock first = a.lock(key);
                assertTrue(first.tryLock(), "round " + round + ": a");
                first.unlock();
                if (round % 2 == 1) {
                    assertTrue(b.describe(key).holders().isEmpty(), "round " + round + ": describe after unlock");
                }
                LocksideLock next = b.lock(key);
                assertTrue(next.tryLock(), "round " + round + ": the key was busy right after unlock");
                next.unlock();
            }
        }
    }
}
