package io.lockside;

import io.grpc.Metadata;
import io.grpc.Status;
import io.grpc.stub.ClientCallStreamObserver;
import io.grpc.stub.ClientResponseObserver;
import io.grpc.stub.MetadataUtils;
import java.lang.System.Logger.Level;
import java.time.Duration;
import java.util.ArrayList;
import java.util.EnumSet;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import lockside.v1.LockServiceGrpc;
import lockside.v1.Lockside;

/**
 * One session: the {@code Lease} stream that holds the client's locks, and the streams
 * that resume it after a break. Every method runs with the client's monitor ({@code
 * core.mu}) held: callers take it, and the stream's callbacks take it first.
 *
 * <p>A broken stream (DESIGN.md, "A broken stream"): the sidecar may have died with the
 * locks still in the store, or a live sidecar may have seen the stream end and released
 * them at once; from here the two look the same. So every held lock is <em>suspended</em>
 * at once, and new streams carrying {@code lockside-resume: <token>} are opened with
 * backoff (50 ms doubling to 500 ms) until one answers or every lock's TTL has passed
 * since the break. A lock is restored when the resumed session lists it (a {@code
 * Granted} with request id 0, the same holder and fencing token), and lost otherwise.
 */
final class Session {
    private static final System.Logger LOG = System.getLogger("io.lockside");

    enum State {
        /** The stream is open; SessionStarted has not come yet (requests may be sent). */
        STARTING,
        OPEN,
        /** The stream broke; held locks are suspended while new streams try to resume. */
        RESUMING,
        ENDED
    }

    static final Metadata.Key<String> RESUME_HEADER =
            Metadata.Key.of("lockside-resume", Metadata.ASCII_STRING_MARSHALLER);
    static final Metadata.Key<String> CLIENT_NAME_HEADER =
            Metadata.Key.of("lockside-client-name", Metadata.ASCII_STRING_MARSHALLER);

    /** First pause between resume attempts, doubled up to {@link #MAX_BACKOFF_NANOS}. */
    private static final long FIRST_BACKOFF_NANOS = TimeUnit.MILLISECONDS.toNanos(50);
    private static final long MAX_BACKOFF_NANOS = TimeUnit.MILLISECONDS.toNanos(500);
    /**
     * How long one resume attempt may go without SessionStarted: a frozen sidecar's
     * kernel still accepts connections, and nothing would ever answer on them.
     */
    private static final long ATTEMPT_TIMEOUT_NANOS = TimeUnit.SECONDS.toNanos(1);

    /**
     * Stream endings that may mean the sidecar died (killed, crashed, frozen and noticed
     * by keepalive, a connection reset): the session may be resumed. Any other ending
     * was the sidecar's decision, and it released everything.
     */
    private static final Set<Status.Code> RESUMABLE =
            EnumSet.of(Status.Code.UNAVAILABLE, Status.Code.INTERNAL, Status.Code.UNKNOWN, Status.Code.CANCELLED);

    /**
     * Resume attempts ending so will not succeed by retrying. FAILED_PRECONDITION is
     * retried: a restarted sidecar refuses while its dead predecessor's attachment lives
     * (up to --attachment-ttl), and says the same of a token it does not know; the
     * lock's TTL bounds the retries.
     */
    private static final Set<Status.Code> FINAL_RESUME = EnumSet.of(
            Status.Code.UNIMPLEMENTED, Status.Code.UNAUTHENTICATED, Status.Code.PERMISSION_DENIED,
            Status.Code.INVALID_ARGUMENT);

    private final Core core;
    State state = State.STARTING;
    String sessionId = "";
    Duration defaultTtl = Duration.ofSeconds(10);
    private String resumeToken = "";
    private boolean closing;
    /** Requests waiting for their answers, by request id (ids only grow: in order). */
    final Map<Long, Pending> pending = new TreeMap<>();
    /** Grants this session holds for the sidecar, by (holder, key). */
    final Map<Slot, Grant> held = new HashMap<>();
    private Stream stream;
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
    private String brokeReason = "";
    private String lastAttempt = "";
    private long backoffNanos;
    private ScheduledFuture<?> attemptTimer;
    private ScheduledFuture<?> expiryTimer;

    Session(Core core) {
        this.core = core;
    }

    /** Opens the session's first stream. */
    void start(boolean patient) {
        this.patient = patient;
        stream = new Stream(false, false);
        stream.open(null);
    }

    // -- requests --------------------------------------------------------------

    Pending acquire(Spec spec, Duration wait) {
        long id = core.nextId();
        Pending p = new Pending(id, Pending.Kind.ACQUIRE, spec.slot(), Wire.acquire(id, spec, wait), this);
        p.spec = spec;
        pending.put(id, p);
        send(p.request);
        return p;
    }

    Pending release(Slot slot) {
        long id = core.nextId();
        Pending p = new Pending(id, Pending.Kind.RELEASE, slot, Wire.release(id, slot), this);
        pending.put(id, p);
        send(p.request);
        return p;
    }

    Pending proclaim(Slot slot, byte[] value) {
        long id = core.nextId();
        Pending p = new Pending(id, Pending.Kind.PROCLAIM, slot, Wire.proclaim(id, slot, value), this);
        pending.put(id, p);
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

    private void send(Lockside.LeaseRequest request) {
        try {
            stream.requests.onNext(request);
        } catch (RuntimeException e) {
            // The call is already closed: its end is on its way to onEnd.
            LOG.log(Level.DEBUG, "lockside: a request was not sent: {0}", e.toString());
        }
    }

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

    // -- what the stream says --------------------------------------------------

    private void onMessage(Stream s, Lockside.LeaseResponse r) {
        if (s != stream || s.done) {
            return;
        }
        if (s.greetingLeft < 0) {
            if (r.getEventCase() != Lockside.LeaseResponse.EventCase.STARTED) {
                s.cancel("protocol error: the stream opened with " + r.getEventCase() + ", not SessionStarted");
                return;
            }
            Lockside.SessionStarted st = r.getStarted();
            if (!s.resume) {
                sessionId = st.getSessionId();
                if (st.hasDefaultTtl()) {
                    defaultTtl = Wire.duration(st.getDefaultTtl());
                }
                resumeToken = st.getResumeToken();
                s.greetingLeft = 0;
                state = State.OPEN;
                started.complete(null);
                core.mu.notifyAll();
                return;
            }
            s.startedMessage = st;
            s.greetingLeft = st.getResumedLocks();
            if (s.greetingLeft == 0) {
                resumed(s);
            }
            return;
        }
        if (s.greetingLeft > 0) {
            s.greeting.add(r);
            if (--s.greetingLeft == 0) {
                resumed(s);
            }
            return;
        }
        dispatch(r);
    }

    private void dispatch(Lockside.LeaseResponse r) {
        switch (r.getEventCase()) {
            case GRANTED:
            case NOT_ACQUIRED:
            case RELEASED:
            case REJECTED:
            case PROCLAIMED:
                answered(r);
                break;
            case LOST: {
                Lockside.Lost l = r.getLost();
                Grant g = held.remove(new Slot(l.getHolder(), l.getKey()));
                if (g != null) {
                    core.markLost(g, l.getReason().isEmpty() ? "the sidecar sent Lost" : l.getReason());
                }
                break;
            }
            case JEOPARDY: {
                Lockside.Jeopardy j = r.getJeopardy();
                LOG.log(Level.WARNING, "lockside: lock {0} of {1} in jeopardy: renewals failing, {2} of validity left",
                        Keys.show(j.getKey()), j.getHolder(), Wire.duration(j.getTtlRemaining()));
                break;
            }
            case RESTORED:
                LOG.log(Level.INFO, "lockside: renewals of {0} succeed again", Keys.show(r.getRestored().getKey()));
                break;
            default:
                break; // Waiting, and anything newer than this client
        }
    }

    /** Routes an answer to the request it answers. */
    private void answered(Lockside.LeaseResponse r) {
        Pending p = pending.remove(Wire.answerId(r));
        if (p == null) {
            // The answer to a request sent without waiting (giveBack), or to an acquire
            // its caller abandoned (the Release sent after it settles the key).
            return;
        }
        if (r.getEventCase() == Lockside.LeaseResponse.EventCase.GRANTED && p.kind == Pending.Kind.ACQUIRE) {
            Lockside.Granted granted = r.getGranted();
            Spec spec = p.spec;
            Grant g = new Grant(p.slot, granted.getFencingToken(), spec.mode(), spec.limit(),
                    spec.ttl() != null ? spec.ttl() : defaultTtl, this);
            g.add(spec.mode());
            held.put(p.slot, g);
            core.grants.put(p.slot, g);
            p.grant = g;
            if (granted.getHoldCount() > 1) {
                // Holds nobody here knows of (a Release that never got through): the
                // sidecar's count is the truth; keep one.
                giveBack(p.slot, granted.getHoldCount() - 1);
            }
        }
        p.answer.complete(r);
    }

    private void onEnd(Stream s, Status status) {
        if (s != stream || s.done) {
            s.done = true;
            return;
        }
        s.done = true;
        if (s.startTimer != null) {
            s.startTimer.cancel(false);
        }
        switch (state) {
            case STARTING:
                if (patient && firstFailure == null && status.getCode() == Status.Code.UNAVAILABLE && !closing) {
                    firstFailure = status;
                    core.reconnectNow();
                    Stream again = new Stream(false, true);
                    stream = again;
                    again.open(null);
                    again.startTimer = cancelUnlessStarted(again);
                    for (Pending p : pending.values()) {
                        send(p.request);
                    }
                    break;
                }
                end(Calls.unreachable(core.address, firstFailure != null ? firstFailure : status), false);
                break;
            case OPEN:
                broke(status);
                break;
            case RESUMING:
                attemptFailed(status);
                break;
            default:
                break;
        }
    }

    // -- breaking and resuming -------------------------------------------------

    private void broke(Status status) {
        String reason = Calls.describe(status);
        if (closing) {
            end("the client closed", false);
            return;
        }
        boolean resumable = !resumeToken.isEmpty() && !held.isEmpty()
                && RESUMABLE.contains(status.getCode())
                // A sidecar stopping cleanly (SIGTERM) sends Lost for every lock and
                // releases, then ends its streams saying so: nothing is left to resume.
                && (status.getDescription() == null || !status.getDescription().contains("shutting down"));
        // The sidecar does not resume waits in progress: their callers ask again.
        for (var it = pending.values().iterator(); it.hasNext(); ) {
            Pending p = it.next();
            if (p.kind == Pending.Kind.ACQUIRE) {
                it.remove();
                p.answer.completeExceptionally(new Pending.Broken(
                        "the stream to the sidecar at " + core.address + " broke while waiting (" + reason + ")", true));
            }
        }
        if (!resumable) {
            end(resumeToken.isEmpty() && !held.isEmpty()
                    ? "the stream to the sidecar broke (" + reason + ") and its store cannot resume sessions"
                    : "the stream to the sidecar broke (" + reason + ")", true);
            return;
        }
        state = State.RESUMING;
        brokeReason = reason;
        lastAttempt = "no attempt finished";
        long now = System.nanoTime();
        for (Grant g : held.values()) {
            g.suspended = true;
            g.deadlineNanos = now + g.ttl.toNanos();
            LockEvent e = g.event();
            core.events.fire(l -> l.onSuspended(e));
        }
        LOG.log(Level.WARNING, "lockside: the stream of session {0} broke ({1}): {2} lock(s) suspended, resuming",
                sessionId, reason, held.size());
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
        if (state != State.RESUMING) {
            return;
        }
        // A sidecar restarted on the same address: reconnect now, not after the
        // channel's own reconnect backoff.
        core.reconnectNow();
        Stream s = new Stream(true, true);
        stream = s;
        s.open(resumeToken);
        s.startTimer = cancelUnlessStarted(s);
    }

    /** Cancels a stream that waits for its connection or SessionStarted for over 1 s. */
    private ScheduledFuture<?> cancelUnlessStarted(Stream s) {
        return core.timers.schedule(() -> {
            synchronized (core.mu) {
                if (stream == s && !s.done && s.greetingLeft < 0) {
                    s.cancel("no SessionStarted within 1 s");
                }
            }
        }, ATTEMPT_TIMEOUT_NANOS, TimeUnit.NANOSECONDS);
    }

    private void attemptFailed(Status status) {
        lastAttempt = Calls.describe(status);
        LOG.log(Level.DEBUG, "lockside: a resume attempt failed: {0}", lastAttempt);
        if (FINAL_RESUME.contains(status.getCode())) {
            end("the stream to the sidecar broke (" + brokeReason + ") and resuming the session failed: "
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
        for (Grant g : held.values()) {
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
        if (state != State.RESUMING) {
            return;
        }
        long now = System.nanoTime();
        String why = "the stream to the sidecar broke (" + brokeReason
                + ") and the session was not resumed within the lock's TTL (last attempt: " + lastAttempt + ")";
        for (var it = held.values().iterator(); it.hasNext(); ) {
            Grant g = it.next();
            if (g.deadlineNanos - now <= 0) {
                it.remove();
                core.markLost(g, why);
            }
        }
        if (held.isEmpty()) {
            end(why, true);
            return;
        }
        scheduleExpiry();
    }

    /**
     * A resume attempt was answered: SessionStarted, then a Granted (request id 0) or
     * Lost for each lock of the session's record. Reconciles what is held here with what
     * came back; the stream becomes the session's.
     */
    private void resumed(Stream s) {
        state = State.OPEN;
        resumeToken = s.startedMessage.getResumeToken();
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
        for (var it = held.values().iterator(); it.hasNext(); ) {
            Grant g = it.next();
            Lockside.Granted b = back.remove(g.slot);
            if (b == null || b.getFencingToken() != g.fencingToken) {
                it.remove();
                String why = lostBack.get(g.slot);
                core.markLost(g, "lost while the stream was broken: "
                        + (why != null && !why.isEmpty() ? why : "the resumed session did not list it"));
                if (b != null) {
                    giveBack(g.slot, b.getHoldCount());
                }
                continue;
            }
            restored++;
            g.suspended = false;
            LockEvent e = g.event();
            core.events.fire(l -> l.onRestored(e));
            if (b.getHoldCount() > 1) {
                giveBack(g.slot, b.getHoldCount() - 1);
            }
        }
        // Unanswered releases and proclaims (acquires failed at the break): a Release
        // of a key that came back goes again; one whose key did not was applied, or the
        // key is gone anyway.
        for (var it = pending.values().iterator(); it.hasNext(); ) {
            Pending p = it.next();
            if (p.kind == Pending.Kind.RELEASE) {
                Lockside.Granted b = back.remove(p.slot);
                if (b != null) {
                    send(p.request);
                    giveBack(p.slot, b.getHoldCount() - 1);
                } else {
                    it.remove();
                    p.answer.complete(Lockside.LeaseResponse.newBuilder()
                            .setReleased(Lockside.Released.newBuilder()
                                    .setRequestId(p.id).setKey(p.slot.key()).setHolder(p.slot.holder()))
                            .build());
                }
            } else if (p.kind == Pending.Kind.PROCLAIM) {
                if (held.containsKey(p.slot)) {
                    send(p.request);
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
            giveBack(e.getKey(), e.getValue().getHoldCount());
        }
        LOG.log(Level.WARNING, "lockside: session {0} resumed: {1} lock(s) restored, {2} lost",
                sessionId, restored, lostBack.size());
        core.mu.notifyAll();
    }

    private void cancelTimers() {
        if (attemptTimer != null) {
            attemptTimer.cancel(false);
        }
        if (expiryTimer != null) {
            expiryTimer.cancel(false);
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
        cancelTimers();
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

    // -- one gRPC call ---------------------------------------------------------

    /** One Lease call: the session's first stream, or one resume attempt. */
    private final class Stream implements ClientResponseObserver<Lockside.LeaseRequest, Lockside.LeaseResponse> {
        final boolean resume;
        final boolean waitForReady;
        ClientCallStreamObserver<Lockside.LeaseRequest> requests;
        /** -1 until SessionStarted; then how many greeting messages are still to come. */
        int greetingLeft = -1;
        Lockside.SessionStarted startedMessage;
        final List<Lockside.LeaseResponse> greeting = new ArrayList<>();
        boolean done;
        ScheduledFuture<?> startTimer;

        Stream(boolean resume, boolean waitForReady) {
            this.resume = resume;
            this.waitForReady = waitForReady;
        }

        void open(String token) {
            Metadata headers = new Metadata();
            if (!core.options.clientName().isEmpty()) {
                headers.put(CLIENT_NAME_HEADER, core.options.clientName());
            }
            if (token != null) {
                headers.put(RESUME_HEADER, token);
            }
            LockServiceGrpc.LockServiceStub stub =
                    core.transport.stub.withInterceptors(MetadataUtils.newAttachHeadersInterceptor(headers));
            if (waitForReady) {
                // Wait for the connection (bounded by a timer) rather than fail at once on
                // the channel's memory of the last failed connection.
                stub = stub.withWaitForReady();
            }
            stub.lease(this);
        }

        void cancel(String why) {
            if (requests != null) {
                requests.cancel(why, null);
            }
        }

        @Override
        public void beforeStart(ClientCallStreamObserver<Lockside.LeaseRequest> requestStream) {
            this.requests = requestStream;
        }

        @Override
        public void onNext(Lockside.LeaseResponse value) {
            synchronized (core.mu) {
                onMessage(this, value);
            }
        }

        @Override
        public void onError(Throwable t) {
            synchronized (core.mu) {
                onEnd(this, Status.fromThrowable(t));
            }
        }

        @Override
        public void onCompleted() {
            synchronized (core.mu) {
                onEnd(this, Status.OK.withDescription("the sidecar ended the stream"));
            }
        }
    }
}
