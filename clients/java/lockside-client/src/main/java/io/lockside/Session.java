package io.lockside;

import io.grpc.Status;
import java.time.Duration;
import java.util.HashMap;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.CompletableFuture;
import lockside.v1.Lockside;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * One session: the {@code Lease} stream that holds the client's locks, the requests
 * waiting for their answers on it, and the grants it holds for the sidecar. Every method
 * runs with the client's monitor ({@code core.mu}) held: callers take it, and the
 * stream's callbacks take it first.
 *
 * <p>Its parts: {@link LeaseStream} is one gRPC call, {@link Inbox} routes what the
 * sidecar says on it, and {@link Resumption} suspends the held locks when the stream
 * breaks and resumes the session on new streams.
 */
final class Session {
    private static final Logger LOG = LoggerFactory.getLogger("io.lockside");

    enum State {
        /** The stream is open; SessionStarted has not come yet (requests may be sent). */
        STARTING,
        OPEN,
        /** The stream broke; held locks are suspended while new streams try to resume. */
        RESUMING,
        ENDED
    }

    final Core core;
    final Inbox inbox = new Inbox(this);
    final Resumption resumption;
    State state = State.STARTING;
    String sessionId = "";
    Duration defaultTtl = Duration.ofSeconds(10);
    /** What a new stream presents to resume the session; empty when the store cannot. */
    String resumeToken = "";
    /** The client closes: a stream ending now is not resumed. */
    boolean closing;
    /** Requests waiting for their answers, by request id (ids only grow: in order). */
    final Map<Long, Pending> pending = new TreeMap<>();
    /** Grants this session holds for the sidecar, by (holder, key). */
    final Map<Slot, Grant> held = new HashMap<>();
    /** The session's stream: the first, or the latest resume attempt. */
    LeaseStream stream;
    /** SessionStarted of the first stream, or why none came. */
    final CompletableFuture<Void> started = new CompletableFuture<>();
    /** Completes when the session has ended. */
    final CompletableFuture<Void> ended = new CompletableFuture<>();

    /**
     * Whether a first stream that fails UNAVAILABLE is tried once more, waiting up to
     * 1 s for the connection: a session opened after an earlier one ended may meet the
     * channel's memory of a failed connection to a sidecar that is back since.
     */
    private boolean patient;
    private Status firstFailure;

    Session(Core core) {
        this.core = core;
        this.resumption = new Resumption(this);
    }

    /** Opens the session's first stream. */
    void start(boolean patient) {
        this.patient = patient;
        stream = new LeaseStream(this, false, false);
        stream.open(null);
    }

    /** The first stream's SessionStarted: the session is open. */
    void opened(Lockside.SessionStarted st) {
        sessionId = st.getSessionId();
        if (st.hasDefaultTtl()) {
            defaultTtl = Wire.duration(st.getDefaultTtl());
        }
        resumeToken = st.getResumeToken();
        state = State.OPEN;
        started.complete(null);
        core.mu.notifyAll();
    }

    /** The first stream ended before SessionStarted: once more if patient, else the end. */
    void firstStreamEnded(Status status) {
        // A keepalive ping unanswered within 1 s on a connection that did connect: a
        // starting JVM (or sidecar) on a loaded machine, not a missing sidecar. Once more.
        boolean keepalive = status.getDescription() != null && status.getDescription().startsWith("Keepalive failed");
        if ((patient || keepalive) && firstFailure == null && status.getCode() == Status.Code.UNAVAILABLE
                && !closing) {
            firstFailure = status;
            core.reconnectNow();
            LeaseStream again = new LeaseStream(this, false, true);
            stream = again;
            again.open(null);
            again.cancelUnlessStarted();
            for (Pending p : pending.values()) {
                send(p.request);
            }
            return;
        }
        end(Calls.unreachable(core.options, firstFailure != null ? firstFailure : status), false);
    }

    // -- requests --------------------------------------------------------------

    Pending acquire(Spec spec, Duration wait) {
        long id = core.nextId();
        Pending p = new Pending(id, Pending.Kind.ACQUIRE, spec.slot(), Wire.acquire(id, spec, wait), this);
        p.spec = spec;
        return ask(p);
    }

    Pending release(Slot slot) {
        long id = core.nextId();
        return ask(new Pending(id, Pending.Kind.RELEASE, slot, Wire.release(id, slot), this));
    }

    Pending proclaim(Slot slot, byte[] value) {
        long id = core.nextId();
        return ask(new Pending(id, Pending.Kind.PROCLAIM, slot, Wire.proclaim(id, slot, value), this));
    }

    private Pending ask(Pending p) {
        pending.put(p.id, p);
        send(p.request);
        return p;
    }

    /**
     * Releases `holds` holds of `slot` without waiting for the answers: a grant nobody
     * here holds any more, or a wait nobody waits for (a Release of a key only waited
     * for cancels the wait; one that crossed its grant gives the grant back).
     */
    void giveBack(Slot slot, int holds) {
        for (int i = 0; i < holds; i++) {
            send(Wire.release(core.nextId(), slot));
        }
    }

    void send(Lockside.LeaseRequest request) {
        try {
            stream.requests.onNext(request);
        } catch (RuntimeException e) {
            // The call is already closed: its end is on its way to the inbox.
            LOG.debug("lockside: a request was not sent: {}", e.toString());
        }
    }

    // -- ending ----------------------------------------------------------------

    /**
     * The client closes: a half-close ends the stream cleanly, and the sidecar releases
     * every lock of the session at once. A session being resumed just ends.
     */
    void close() {
        closing = true;
        if (state == State.STARTING || state == State.OPEN) {
            try {
                stream.requests.onCompleted();
            } catch (RuntimeException e) {
                end("the client closed", false);
            }
        } else {
            end("the client closed", false);
        }
    }

    /**
     * The session is over: what waits fails (`retry`: the caller may ask again on a new
     * session), what is held is lost.
     */
    void end(String reason, boolean retry) {
        if (state == State.ENDED) {
            return;
        }
        state = State.ENDED;
        resumption.cancelTimers();
        for (Pending p : pending.values()) {
            p.answer.completeExceptionally(new Pending.Broken(reason, retry));
        }
        pending.clear();
        for (Grant g : held.values()) {
            core.markLost(g, reason);
        }
        held.clear();
        if (stream != null && !stream.done) {
            stream.cancel(reason);
        }
        started.completeExceptionally(new LocksideUnavailableException(reason));
        ended.complete(null);
        core.mu.notifyAll();
    }
}
