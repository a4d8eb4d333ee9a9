package io.lockside;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.lockside.testkit.Await;
import io.lockside.testkit.RedisServer;
import io.lockside.testkit.Sidecar;
import java.time.Duration;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * Issue 32: no grant without a way back, and a session that cannot be resumed holds up
 * nothing else. A sidecar killed right after a grant gives the lock back on resume; one
 * that does not know the session (refused: lockside-resume-refused "unknown") makes the
 * client lose its locks at once, and the same client locks other keys on a new session.
 */
@Timeout(60)
class ResumeRefusedTest {
    RedisServer redis;
    Sidecar sidecar;
    final Recorder events = new Recorder();

    @BeforeEach
    void start() {
        redis = RedisServer.start();
        // Restarted in place, the sidecar takes over its dead predecessor's sessions soon.
        sidecar = Sidecar.start(redis.url(), "--attachment-ttl", "600ms");
    }

    @AfterEach
    void stopAll() {
        sidecar.close();
        redis.close();
    }

    private LocksideClient connect() {
        return LocksideClient.connect(ClientOptions.defaults().address(sidecar.address()).listener(events));
    }

    @Test
    void aSidecarKilledRightAfterAGrantGivesTheLockBackOnResume() throws Exception {
        try (LocksideClient client = connect()) {
            LocksideLock lock = client.lock("granted/killed", LockOptions.defaults().ttl(Duration.ofSeconds(10)));
            lock.lock();
            long token = lock.fencingToken();
            // Killed right after the grant: the sidecar names a grant in the session's
            // record before it answers Granted (issue 32, item 3), so the lock comes back.
            sidecar.kill();
            assertEquals("suspended granted/killed", events.next(5000));
            sidecar.restart();
            assertEquals("restored granted/killed", events.next(10_000));
            assertEquals(token, lock.fencingToken(), "the same grant");
            assertEquals(SessionState.OPEN, client.sessionState());
            lock.unlock();
        }
    }

    @Test
    void afterASessionTheSidecarDoesNotKnowTheSameClientLocksAnotherKeyWithinASecond() throws Exception {
        try (LocksideClient client = connect()) {
            LocksideLock lock = client.lock("forgotten/held", LockOptions.defaults().ttl(Duration.ofSeconds(10)));
            lock.lock();
            String before = client.sessionId();
            sidecar.kill();
            assertEquals("suspended forgotten/held", events.next(5000));
            assertEquals(SessionState.RESUMING, client.sessionState());
            redis.command("FLUSHALL"); // the session's record is gone: its token is unknown now
            sidecar.restart();
            long back = System.nanoTime();
            LocksideLock other = client.lock("forgotten/other");
            assertTrue(other.tryLock(5, TimeUnit.SECONDS), "another key on a new session");
            long took = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - back);
            assertTrue(took < 1000, "granted " + took + " ms after the sidecar was back, not after the lock's TTL");
            assertEquals("lost forgotten/held", events.next(1000), "told, not kept waiting for the TTL");
            assertTrue(events.lastLostReason.contains("does not know"), events.lastLostReason);
            assertFalse(before.equals(client.sessionId()), "a new session");
            assertThrows(LockLostException.class, lock::unlock);
            other.unlock();
        }
    }
}
