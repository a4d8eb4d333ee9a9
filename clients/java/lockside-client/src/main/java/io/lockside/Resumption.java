package io.lockside;

import io.grpc.Status;
import java.util.EnumSet;
import java.util.HashMap;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import lockside.v1.Lockside;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * A {@link Session} whose stream broke, and its resumption (DESIGN.md, "A broken
 * stream"). Runs under the client's monitor, as the session does.
 *
 * <p>The sidecar may have died with the locks still in the store, or a live sidecar may
 * have seen the stream end and released them at once; from here the two look the same.
 * So every held lock is <em>suspended</em> at once, and new streams carrying {@code
 * lockside-resume: <token>} are opened with backoff (50 ms doubling to 500 ms) until one
 * answers or every lock's TTL has passed since the break. A lock is restored when the
 * resumed session lists it (a {@code Granted} with request id 0, the same holder and
 * fencing token), and lost otherwise.
 */
final class Resumption {
    private static final Logger LOG = LoggerFactory.getLogger("io.lockside");

    /** First pause between resume attempts, doubled up to {@link #MAX_BACKOFF_NANOS}. */
    private static final long FIRST_BACKOFF_NANOS = TimeUnit.MILLISECONDS.toNanos(50);
    private static final long MAX_BACKOFF_NANOS = TimeUnit.MILLISECONDS.toNanos(500);

    /**
     * Stream endings that may mean the sidecar died (killed, crashed, frozen and noticed
     * by keepalive, a connection reset): the session may be resumed. Any other ending
     * was the sidecar's decision, and it released everything.
     */
    private static final Set<Status.Code> RESUMABLE =
            EnumSet.of(Status.Code.UNAVAILABLE, Status.Code.INTERNAL, Status.Code.UNKNOWN, Status.Code.CANCELLED);

    /**
     * Resume attempts ending so will not succeed by retrying. FAILED_PRECONDITION is
     * retried unless its trailer says "unknown": "attached" (a restarted sidecar refuses
     * while its dead predecessor's attachment lives, up to --attachment-ttl), or a
     * sidecar that does not say; the lock's TTL bounds the retries.
     */
    private static final Set<Status.Code> FINAL_RESUME = EnumSet.of(
            Status.Code.UNIMPLEMENTED, Status.Code.UNAUTHENTICATED, Status.Code.PERMISSION_DENIED,
            Status.Code.INVALID_ARGUMENT);

    private final Session session;
    private final Core core;
    private String brokeReason = "";
    private String lastAttempt = "";
    private long backoffNanos;
    private ScheduledFuture<?> attemptTimer;
    private ScheduledFuture<?> expiryTimer;

    Resumption(Session session) {
        this.session = session;
        this.core = session.core;
    }

    /**
     * The open session's stream ended with `status`: suspend what is held and resume, or,
     * when nothing can be resumed, end the session.
     */
    void broke(Status status) {
        String reason = Calls.describe(status);
        if (session.closing) {
            session.end("the client closed", false);
            return;
        }
        boolean resumable = !session.resumeToken.isEmpty() && !session.held.isEmpty()
                && RESUMABLE.contains(status.getCode())
                // A sidecar stopping cleanly (SIGTERM) sends Lost for every lock and
                // releases, then ends its streams saying so: nothing is left to resume.
                && (status.getDescription() == null || !status.getDescription().contains("shutting down"));
        // The sidecar does not resume waits in progress: their callers ask again.
        for (var it = session.pending.values().iterator(); it.hasNext(); ) {
            Pending p = it.next();
            if (p.kind == Pending.Kind.ACQUIRE) {
                it.remove();
                p.answer.completeExceptionally(new Pending.Broken(
                        "the stream to the sidecar at " + core.address + " broke while waiting (" + reason + ")", true));
            }
        }
        if (!resumable) {
            session.end(session.resumeToken.isEmpty() && !session.held.isEmpty()
                    ? "the stream to the sidecar broke (" + reason + ") and its store cannot resume sessions"
                    : "the stream to the sidecar broke (" + reason + ")", true);
            return;
        }
        session.state = Session.State.RESUMING;
        brokeReason = reason;
        lastAttempt = "no attempt finished";
        long now = System.nanoTime();
        for (Grant g : session.held.values()) {
            g.suspended = true;
            g.deadlineNanos = now + g.ttl.toNanos();
            LockEvent e = g.event();
            core.events.fire(l -> l.onSuspended(e));
        }
        LOG.warn("lockside: the stream of session {} broke ({}): {} lock(s) suspended, resuming",
                session.sessionId, reason, session.held.size());
        backoffNanos = FIRST_BACKOFF_NANOS;
        scheduleAttempt(0);
        scheduleExpiry();
        core.mu.notifyAll();
    }

    private void scheduleAttempt(long delayNanos) {
        attemptTimer = core.timers.schedule(() -> {
            synchronized (core.mu) {
                attempt();
            }
        }, delayNanos, TimeUnit.NANOSECONDS);
    }

    private void attempt() {
        if (session.state != Session.State.RESUMING) {
            return;
        }
        // A sidecar restarted on the same address: reconnect now, not after the
        // channel's own reconnect backoff.
        core.reconnectNow();
        LeaseStream s = new LeaseStream(session, true, true);
        session.stream = s;
        s.open(session.resumeToken);
        s.cancelUnlessStarted();
    }

    /**
     * A resume attempt's stream ended before its greeting: try again, unless it is final.
     * `refused`: the sidecar's lockside-resume-refused trailer, or null.
     */
    void attemptFailed(Status status, String refused) {
        lastAttempt = Calls.describe(status);
        LOG.debug("lockside: a resume attempt failed ({}): {}", refused == null ? "no reason given" : refused,
                lastAttempt);
        if (status.getCode() == Status.Code.FAILED_PRECONDITION && "unknown".equals(refused)) {
            // The session is gone (its record never written, spent or expired): asking
            // again cannot help. Its locks are lost now; the next lock opens a new
            // session at once rather than wait for the TTL.
            LOG.warn("lockside: session {} cannot be resumed: the sidecar at {} does not know it; {} lock(s) lost",
                    session.sessionId, core.address, session.held.size());
            session.end("the stream to the sidecar broke (" + brokeReason
                    + ") and the sidecar refused to resume the session: it does not know it "
                    + "(never recorded, spent or expired)", true);
            return;
        }
        if (FINAL_RESUME.contains(status.getCode())) {
            session.end("the stream to the sidecar broke (" + brokeReason + ") and resuming the session failed: "
                    + lastAttempt, true);
            return;
        }
        long delay = backoffNanos;
        backoffNanos = Math.min(backoffNanos * 2, MAX_BACKOFF_NANOS);
        scheduleAttempt(delay);
    }

    /** While resuming: loses every lock whose TTL has passed since the break. */
    private void scheduleExpiry() {
        long next = Long.MAX_VALUE;
        for (Grant g : session.held.values()) {
            next = Math.min(next, g.deadlineNanos);
        }
        if (next == Long.MAX_VALUE) {
            return;
        }
        expiryTimer = core.timers.schedule(() -> {
            synchronized (core.mu) {
                expire();
            }
        }, Math.max(0, next - System.nanoTime()), TimeUnit.NANOSECONDS);
    }

    private void expire() {
        if (session.state != Session.State.RESUMING) {
            return;
        }
        long now = System.nanoTime();
        String why = "the stream to the sidecar broke (" + brokeReason
                + ") and the session was not resumed within the lock's TTL (last attempt: " + lastAttempt + ")";
        for (var it = session.held.values().iterator(); it.hasNext(); ) {
            Grant g = it.next();
            if (g.deadlineNanos - now <= 0) {
                it.remove();
                core.markLost(g, why);
            }
        }
        if (session.held.isEmpty()) {
            session.end(why, true);
            return;
        }
        scheduleExpiry();
    }

    /**
     * A resume attempt was answered: SessionStarted, then a Granted (request id 0) or
     * Lost for each lock of the session's record. Reconciles what is held here with what
     * came back; the stream becomes the session's.
     */
    void resumed(LeaseStream s) {
        session.state = Session.State.OPEN;
        session.resumeToken = s.startedMessage.getResumeToken();
        s.greetingLeft = 0;
        if (s.startTimer != null) {
            s.startTimer.cancel(false);
        }
        cancelTimers();
        Map<Slot, Lockside.Granted> back = new HashMap<>();
        Map<Slot, String> lostBack = new HashMap<>();
        for (Lockside.LeaseResponse r : s.greeting) {
            if (r.getEventCase() == Lockside.LeaseResponse.EventCase.GRANTED) {
                Lockside.Granted g = r.getGranted();
                back.put(new Slot(g.getHolder(), g.getKey()), g);
            } else if (r.getEventCase() == Lockside.LeaseResponse.EventCase.LOST) {
                Lockside.Lost l = r.getLost();
                lostBack.put(new Slot(l.getHolder(), l.getKey()), l.getReason());
            }
        }
        int restored = 0;
        int heldBefore = session.held.size();
        for (var it = session.held.values().iterator(); it.hasNext(); ) {
            Grant g = it.next();
            Lockside.Granted b = back.remove(g.slot);
            if (b == null || b.getFencingToken() != g.fencingToken) {
                it.remove();
                String why = lostBack.get(g.slot);
                core.markLost(g, "lost while the stream was broken: "
                        + (why != null && !why.isEmpty() ? why : "the resumed session did not list it"));
                if (b != null) {
                    session.giveBack(g.slot, b.getHoldCount());
                }
                continue;
            }
            restored++;
            g.suspended = false;
            LockEvent e = g.event();
            core.events.fire(l -> l.onRestored(e));
            if (b.getHoldCount() > 1) {
                session.giveBack(g.slot, b.getHoldCount() - 1);
            }
        }
        // Unanswered releases and proclaims (acquires failed at the break): a Release
        // of a key that came back goes again; one whose key did not was applied, or the
        // key is gone anyway.
        for (var it = session.pending.values().iterator(); it.hasNext(); ) {
            Pending p = it.next();
            if (p.kind == Pending.Kind.RELEASE) {
                Lockside.Granted b = back.remove(p.slot);
                if (b != null) {
                    session.send(p.request);
                    session.giveBack(p.slot, b.getHoldCount() - 1);
                } else {
                    it.remove();
                    p.answer.complete(Lockside.LeaseResponse.newBuilder()
                            .setReleased(Lockside.Released.newBuilder()
                                    .setRequestId(p.id).setKey(p.slot.key()).setHolder(p.slot.holder()))
                            .build());
                }
            } else if (p.kind == Pending.Kind.PROCLAIM) {
                if (session.held.containsKey(p.slot)) {
                    session.send(p.request);
                } else {
                    it.remove();
                    p.answer.completeExceptionally(
                            new Pending.Broken("the lock was lost while the stream was broken", false));
                }
            }
        }
        // Grants nobody here holds any more: released while suspended, or granted just
        // before the break to a caller that has been told to ask again.
        for (var e : back.entrySet()) {
            session.giveBack(e.getKey(), e.getValue().getHoldCount());
        }
        int lostNow = heldBefore - restored;
        if (lostNow == 0) {
            LOG.info("lockside: session {} resumed: {} lock(s) restored", session.sessionId, restored);
        } else {
            LOG.warn("lockside: session {} resumed: {} lock(s) restored, {} lost", session.sessionId, restored,
                    lostNow);
        }
        core.mu.notifyAll();
    }

    /** Stops the pending resume attempt and expiry (resumed, or the session ended). */
    void cancelTimers() {
        if (attemptTimer != null) {
            attemptTimer.cancel(false);
        }
        if (expiryTimer != null) {
            expiryTimer.cancel(false);
        }
    }
}
