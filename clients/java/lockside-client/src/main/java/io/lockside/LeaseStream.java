package io.lockside;

import io.grpc.Metadata;
import io.grpc.Status;
import io.grpc.stub.ClientCallStreamObserver;
import io.grpc.stub.ClientResponseObserver;
import io.grpc.stub.MetadataUtils;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import lockside.v1.LockServiceGrpc;
import lockside.v1.Lockside;

/**
 * One {@code Lease} call of a {@link Session}: its first stream, or one attempt to resume
 * it. What the call receives goes to the session's {@link Inbox}, under the client's
 * monitor; fields are guarded by that monitor.
 */
final class LeaseStream implements ClientResponseObserver<Lockside.LeaseRequest, Lockside.LeaseResponse> {
    private static final Metadata.Key<String> RESUME_HEADER =
            Metadata.Key.of("lockside-resume", Metadata.ASCII_STRING_MARSHALLER);
    /**
     * How a sidecar says why it refused a resume (with FAILED_PRECONDITION): "unknown"
     * (the session is gone: never recorded, spent, expired or malformed) or "attached"
     * (still attached to a live stream elsewhere: try again).
     */
    private static final Metadata.Key<String> REFUSED_TRAILER =
            Metadata.Key.of("lockside-resume-refused", Metadata.ASCII_STRING_MARSHALLER);
    private static final Metadata.Key<String> CLIENT_NAME_HEADER =
            Metadata.Key.of("lockside-client-name", Metadata.ASCII_STRING_MARSHALLER);

    /**
     * How long one resume attempt may go without SessionStarted: a frozen sidecar's
     * kernel still accepts connections, and nothing would ever answer on them.
     */
    private static final long ATTEMPT_TIMEOUT_NANOS = TimeUnit.SECONDS.toNanos(1);

    private final Session session;
    private final Core core;
    final boolean resume;
    private final boolean waitForReady;
    ClientCallStreamObserver<Lockside.LeaseRequest> requests;
    /** -1 until SessionStarted; then how many greeting messages are still to come. */
    int greetingLeft = -1;
    Lockside.SessionStarted startedMessage;
    final List<Lockside.LeaseResponse> greeting = new ArrayList<>();
    boolean done;
    ScheduledFuture<?> startTimer;
    /** The lockside-resume-refused trailer the stream ended with, or null. */
    volatile String refused;

    LeaseStream(Session session, boolean resume, boolean waitForReady) {
        this.session = session;
        this.core = session.core;
        this.resume = resume;
        this.waitForReady = waitForReady;
    }

    /** Starts the call; `token`: the session to resume, or null for a new session. */
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

    /**
     * Cancels this stream if it waits for its connection or SessionStarted for over 1 s.
     * Meanwhile the channel is asked to connect again every 50 ms: its own backoff would
     * notice a sidecar that is back only after a second or more.
     */
    void cancelUnlessStarted() {
        startTimer = core.timers.schedule(() -> {
            synchronized (core.mu) {
                if (session.stream == this && !done && greetingLeft < 0) {
                    cancel("no SessionStarted within 1 s");
                }
            }
        }, ATTEMPT_TIMEOUT_NANOS, TimeUnit.NANOSECONDS);
        long poke = TimeUnit.MILLISECONDS.toNanos(50);
        ScheduledFuture<?>[] poker = new ScheduledFuture<?>[1];
        poker[0] = core.timers.scheduleWithFixedDelay(() -> {
            boolean waiting;
            synchronized (core.mu) {
                waiting = session.stream == this && !done && greetingLeft < 0;
            }
            if (waiting) {
                core.reconnectNow();
            } else if (poker[0] != null) {
                poker[0].cancel(false);
            }
        }, poke, poke, TimeUnit.NANOSECONDS);
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
            session.inbox.message(this, value);
        }
    }

    @Override
    public void onError(Throwable t) {
        Metadata trailers = Status.trailersFromThrowable(t);
        refused = trailers == null ? null : trailers.get(REFUSED_TRAILER);
        synchronized (core.mu) {
            session.inbox.end(this, Status.fromThrowable(t));
        }
    }

    @Override
    public void onCompleted() {
        synchronized (core.mu) {
            session.inbox.end(this, Status.OK.withDescription("the sidecar ended the stream"));
        }
    }
}
