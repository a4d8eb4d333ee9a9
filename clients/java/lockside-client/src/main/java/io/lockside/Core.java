package io.lockside;

import io.grpc.ManagedChannel;
import io.grpc.Status;
import io.grpc.netty.shaded.io.grpc.netty.NettyChannelBuilder;
import io.grpc.netty.shaded.io.netty.channel.EventLoopGroup;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollDomainSocketChannel;
import io.grpc.netty.shaded.io.netty.channel.MultiThreadIoEventLoopGroup;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollIoHandler;
import io.grpc.netty.shaded.io.netty.channel.unix.DomainSocketAddress;
import java.lang.System.Logger.Level;
import java.lang.reflect.Field;
import java.time.Duration;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.function.Consumer;
import lockside.v1.LockServiceGrpc;
import lockside.v1.Lockside;

/**
 * What a {@link LocksideClient} shares among its locks: the channel, the current
 * session, and every grant not yet given back, by (holder, key). One monitor ({@link
 * #mu}) guards all of it; callers block on their own request's answer outside it.
 */
final class Core {
    private static final System.Logger LOG = System.getLogger("io.lockside");

    /** A wait "for as long as it takes". */
    static final long FOREVER = -1;
    /**
     * How long past its own wait an answer may take before the client gives up on it:
     * the sidecar answers every request, so only a broken sidecar or network hits this.
     */
    private static final long ANSWER_SLACK_NANOS = TimeUnit.SECONDS.toNanos(10);
    /** About 146 years: "no deadline" without overflowing nanoTime arithmetic. */
    private static final long FAR_NANOS = Long.MAX_VALUE / 2;
    /**
     * HTTP/2 keepalive well below the shortest TTL (1 s): a frozen sidecar or a dead
     * connection is noticed in about 2 s, and every lock is suspended before the store
     * can let it go (DESIGN.md, "Client guidance").
     */
    private static final long KEEPALIVE_NANOS = TimeUnit.SECONDS.toNanos(1);

    final Object mu = new Object();
    final ClientOptions options;
    final String address;
    final ManagedChannel channel;
    final LockServiceGrpc.LockServiceStub stub;
    final ScheduledExecutorService timers;
    /** Where listeners and lost futures are called: never under the monitor. */
    private final ExecutorService events;
    private final EventLoopGroup group;
    /** Every grant not yet given back (lost ones too, until their holder unlocks). */
    final Map<Slot, Grant> grants = new HashMap<>();
    private Session session;
    private long nextId = 1;
    private boolean closed;

    Core(ClientOptions options) {
        this.options = options;
        this.address = options.address();
        NettyChannelBuilder builder;
        if (address.startsWith("unix:")) {
            String path = address.substring("unix:".length());
            while (path.startsWith("//")) {
                path = path.substring(1);
            }
            group = new MultiThreadIoEventLoopGroup(1, daemon("lockside-uds"), EpollIoHandler.newFactory());
            builder = NettyChannelBuilder.forAddress(new DomainSocketAddress(path))
                    .eventLoopGroup(group)
                    .channelType(EpollDomainSocketChannel.class)
                    // The default authority would be the socket's path, which the
                    // sidecar's HTTP/2 server refuses as a malformed :authority.
                    .overrideAuthority("localhost");
        } else {
            group = null;
            String target = address.startsWith("http://") ? address.substring("http://".length()) : address;
            while (target.endsWith("/")) {
                target = target.substring(0, target.length() - 1);
            }
            builder = NettyChannelBuilder.forTarget(target);
        }
        builder.usePlaintext()
                .keepAliveTime(KEEPALIVE_NANOS, TimeUnit.NANOSECONDS)
                .keepAliveTimeout(KEEPALIVE_NANOS, TimeUnit.NANOSECONDS)
                .keepAliveWithoutCalls(true);
        forceKeepAlive(builder);
        channel = builder.build();
        stub = LockServiceGrpc.newStub(channel);
        ScheduledThreadPoolExecutor t = new ScheduledThreadPoolExecutor(1, daemon("lockside-timers"));
        t.setRemoveOnCancelPolicy(true);
        timers = t;
        events = Executors.newSingleThreadExecutor(daemon("lockside-events"));
    }

    /**
     * grpc-java raises any keepalive time below 10 s to 10 s (a guard for servers it
     * does not know). Ten seconds would leave a lock of the default 10 s TTL in use after
     * a frozen sidecar's store let it go, so the builder's field is set to 1 s directly;
     * the sidecar (hyper) accepts pings at any rate.
     */
    private static void forceKeepAlive(NettyChannelBuilder builder) {
        try {
            Field f = NettyChannelBuilder.class.getDeclaredField("keepAliveTimeNanos");
            f.setAccessible(true);
            f.setLong(builder, KEEPALIVE_NANOS);
        } catch (ReflectiveOperationException | RuntimeException e) {
            LOG.log(Level.WARNING, "lockside: cannot set HTTP/2 keepalive below 10 s on this grpc-java ({0}): "
                    + "a frozen sidecar is noticed later", e.toString());
        }
    }

    private static java.util.concurrent.ThreadFactory daemon(String name) {
        return r -> {
            Thread t = new Thread(r, name);
            t.setDaemon(true);
            return t;
        };
    }

    long nextId() {
        return nextId++;
    }

    // -- sessions ----------------------------------------------------------------

    /**
     * Opens the first session and waits for its SessionStarted: fails fast, naming the
     * address, when nothing listens there, unless asked to wait for the sidecar.
     */
    void start() {
        long waitUntil = System.nanoTime() + options.waitForSidecar().toNanos();
        long backoff = TimeUnit.MILLISECONDS.toNanos(50);
        while (true) {
            Session s;
            synchronized (mu) {
                s = openSession(false);
            }
            try {
                s.started.get(options.connectTimeout().toNanos(), TimeUnit.NANOSECONDS);
                return;
            } catch (ExecutionException e) {
                if (System.nanoTime() + backoff - waitUntil >= 0) {
                    throw e.getCause() instanceof LocksideException
                            ? (LocksideException) e.getCause()
                            : new LocksideUnavailableException(e.getCause().toString(), e.getCause());
                }
            } catch (TimeoutException e) {
                synchronized (mu) {
                    s.end("no answer", false);
                }
                throw new LocksideUnavailableException("the sidecar at " + address
                        + " accepted the connection but did not open a session within "
                        + options.connectTimeout().toMillis() + " ms");
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                synchronized (mu) {
                    s.end("interrupted", false);
                }
                throw new LocksideUnavailableException("interrupted while connecting to the sidecar at " + address);
            }
            try {
                Thread.sleep(TimeUnit.NANOSECONDS.toMillis(backoff)); // waiting for a sidecar to start
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new LocksideUnavailableException("interrupted while waiting for the sidecar at " + address);
            }
            backoff = Math.min(backoff * 2, TimeUnit.MILLISECONDS.toNanos(500));
            channel.resetConnectBackoff();
        }
    }

    /**
     * A new session on a new stream (under the monitor). `patient`: not the first
     * session of the client (see {@link Session#start}).
     */
    private Session openSession(boolean patient) {
        if (session != null && session.state != Session.State.ENDED) {
            throw new IllegalStateException("a session is open");
        }
        channel.resetConnectBackoff();
        session = new Session(this);
        session.start(patient);
        return session;
    }

    /**
     * A call about to go out on a channel whose last connection failed: try to connect
     * now rather than fail with the old error until the channel's backoff (up to two
     * minutes) has passed. The sidecar is local: when it is back, it is back at once.
     */
    void reconnectNow() {
        channel.resetConnectBackoff();
    }

    /** Why the sidecar could not be reached, from the status the first stream ended with. */
    String unreachable(Status status) {
        if (status.getCode() == Status.Code.UNAVAILABLE) {
            String why = Session.describe(status);
            if (why.contains("Connection refused")) {
                why = "connection refused: nothing listens there";
            }
            return "no Lockside sidecar at " + address + " (" + why + "); start the sidecar, set "
                    + ClientOptions.ADDRESS_ENV + ", or wait for it with ClientOptions.waitForSidecar";
        }
        return "the sidecar at " + address + " ended the session before it started: " + Session.describe(status);
    }

    String sessionId() {
        synchronized (mu) {
            return session == null ? "" : session.sessionId;
        }
    }

    // -- acquiring -----------------------------------------------------------------

    /**
     * Acquires `spec` for its holder, waiting up to `waitNanos` ({@link #FOREVER}: as
     * long as it takes). Returns the grant, or null when the key stayed busy. A holder
     * that already holds the key gets one more hold of its grant at once.
     */
    Grant acquire(Spec spec, long waitNanos, boolean interruptible) throws InterruptedException {
        final boolean forever = waitNanos == FOREVER;
        final long deadline = System.nanoTime() + (forever ? FAR_NANOS : Math.max(0, waitNanos));
        final boolean[] interrupted = {false};
        try {
            while (true) {
                Pending p;
                synchronized (mu) {
                    while (true) {
                        if (closed) {
                            throw new IllegalStateException("the Lockside client is closed");
                        }
                        Grant g = grants.get(spec.slot());
                        if (g != null) {
                            if (g.lost) {
                                throw new LockLostException(spec.key(), "this holder still holds the lock it lost ("
                                        + g.lostReason + "): unlock it first", g.fencingToken);
                            }
                            checkReentry(g, spec);
                            if (!g.suspended) {
                                g.add(spec.mode());
                                return g;
                            }
                            // Suspended: one more hold once it is restored (or lost).
                            if (!waitOn(deadline, interruptible, interrupted)) {
                                return null;
                            }
                            continue;
                        }
                        Session s = session;
                        if (s == null || s.state == Session.State.ENDED) {
                            s = openSession(true);
                        }
                        if (s.state == Session.State.RESUMING) {
                            if (!waitOn(deadline, interruptible, interrupted)) {
                                return null;
                            }
                            continue;
                        }
                        Duration wait = forever ? Wire.MAX_WAIT : Duration.ofNanos(Math.max(0, deadline - System.nanoTime()));
                        p = s.acquire(spec, wait);
                        break;
                    }
                }
                long answerWait = (forever ? Wire.MAX_WAIT.toNanos() : Math.max(0, deadline - System.nanoTime()))
                        + ANSWER_SLACK_NANOS;
                Lockside.LeaseResponse r;
                try {
                    r = p.await(answerWait, interruptible);
                } catch (InterruptedException e) {
                    abandon(p);
                    throw e;
                } catch (Pending.Broken b) {
                    if (b.retry && (forever || deadline - System.nanoTime() > 0)) {
                        continue; // on the resumed session, or a new one
                    }
                    throw b.unavailable();
                }
                if (r == null) {
                    abandon(p);
                    throw new LocksideUnavailableException("the sidecar at " + address + " did not answer an acquire of "
                            + Keys.show(spec.key()) + " in time");
                }
                switch (r.getEventCase()) {
                    case GRANTED:
                        return p.grant;
                    case NOT_ACQUIRED:
                        if (forever && r.getNotAcquired().getReason() == Lockside.NotAcquired.Reason.REASON_TIMEOUT) {
                            continue; // waited the sidecar's longest wait: wait again
                        }
                        return null;
                    case REJECTED:
                        throw new LocksideRejectedException(
                                spec.key(), r.getRejected().getCode(), r.getRejected().getMessage());
                    default:
                        throw new LocksideException("protocol error: " + r.getEventCase() + " answered an acquire");
                }
            }
        } finally {
            if (interrupted[0]) {
                Thread.currentThread().interrupt();
            }
        }
    }

    /** A reentrant acquire must agree with the grant, as the sidecar would insist. */
    private static void checkReentry(Grant g, Spec spec) {
        if (Math.max(1, g.limit) != Math.max(1, spec.limit())) {
            throw new LocksideRejectedException(spec.key(), 9, "this holder holds the key with limit "
                    + Math.max(1, g.limit) + " and asks for it with limit " + Math.max(1, spec.limit()));
        }
        if (g.mode == LockMode.SHARED && spec.mode() == LockMode.EXCLUSIVE) {
            throw new LocksideRejectedException(spec.key(), 9,
                    "this holder holds the key SHARED and asks for it EXCLUSIVE: no upgrade (release the read lock first)");
        }
    }

    /**
     * Waits on the monitor until notified or `deadline`; false when the deadline has
     * passed. Not interruptible: an interrupt is remembered in `interrupted[0]`.
     */
    private boolean waitOn(long deadline, boolean interruptible, boolean[] interrupted) throws InterruptedException {
        long left = deadline - System.nanoTime();
        if (left <= 0) {
            return false;
        }
        try {
            TimeUnit.NANOSECONDS.timedWait(mu, left);
        } catch (InterruptedException e) {
            if (interruptible) {
                throw e;
            }
            interrupted[0] = true;
        }
        return true;
    }

    /** The caller stopped waiting for `p` (interrupted, or no answer in time). */
    private void abandon(Pending p) {
        synchronized (mu) {
            Session s = p.session;
            if (p.answer.isDone()) {
                Grant g = p.grant;
                if (g != null && !g.lost && grants.get(g.slot) == g) {
                    // Granted as the caller gave up: nobody will use it.
                    grants.remove(g.slot);
                    s.held.remove(g.slot);
                    if (s.state == Session.State.OPEN) {
                        s.giveBack(g.slot, 1);
                    }
                }
                return;
            }
            s.pending.remove(p.id);
            if (s.state == Session.State.OPEN) {
                // Cancels the wait; if the grant crossed it, gives the grant back.
                s.giveBack(p.slot, 1);
            }
        }
    }

    // -- releasing -------------------------------------------------------------------

    /**
     * Gives back one hold of `slot` taken as `view`; the last one releases the lock.
     * Throws IllegalMonitorStateException when the holder holds no such hold, and
     * LockLostException when the lock was lost while held.
     */
    void release(Slot slot, LockMode view) {
        Pending p;
        synchronized (mu) {
            Grant g = grants.get(slot);
            if (g == null || g.holds(view) == 0) {
                throw new IllegalMonitorStateException("lock " + Keys.show(slot.key()) + " is not held "
                        + (view == LockMode.SHARED ? "for reading " : "") + "by " + slot.holder());
            }
            g.remove(view);
            if (g.lost) {
                if (g.holds() == 0) {
                    grants.remove(slot);
                }
                throw g.lostException();
            }
            if (g.holds() > 0) {
                return;
            }
            grants.remove(slot);
            Session s = g.session;
            s.held.remove(slot);
            if (s.state != Session.State.OPEN) {
                // Resuming: the resumed session lists it and it is given back then; ended:
                // the sidecar released it with the stream.
                return;
            }
            p = s.release(slot);
        }
        for (int attempt = 1; ; attempt++) {
            Lockside.LeaseResponse r = awaitAnswer(p);
            if (r == null || r.getEventCase() != Lockside.LeaseResponse.EventCase.REJECTED) {
                return; // released; or the stream broke (the session gives it back or ends)
            }
            Lockside.Rejected rej = r.getRejected();
            if (rej.getCode() != Status.Code.UNAVAILABLE.value() || attempt == 5) {
                // FAILED_PRECONDITION: a Lost crossed the Release, the key is not held.
                if (rej.getCode() != Status.Code.FAILED_PRECONDITION.value()) {
                    LOG.log(Level.WARNING, "lockside: release of {0} refused: {1}", Keys.show(slot.key()),
                            rej.getMessage());
                }
                return;
            }
            // The store did not answer; no hold was given back, and asking again is safe.
            sleepUninterruptibly(TimeUnit.MILLISECONDS.toNanos(100L << attempt));
            synchronized (mu) {
                Session s = p.session;
                if (s.state != Session.State.OPEN) {
                    return;
                }
                p = s.release(slot);
            }
        }
    }

    /** Gives back a grant held once by its own holder (a permit, a leadership). */
    void releaseOnce(Grant g) {
        release(g.slot, g.mode);
    }

    /** Replaces the value of a held grant (Proclaim). */
    void proclaim(Grant g, byte[] value) {
        Pending p;
        synchronized (mu) {
            boolean interrupted = false;
            while (g.suspended && !g.lost) {
                try {
                    mu.wait();
                } catch (InterruptedException e) {
                    interrupted = true;
                }
            }
            if (interrupted) {
                Thread.currentThread().interrupt();
            }
            if (g.lost) {
                throw g.lostException();
            }
            if (grants.get(g.slot) != g) {
                throw new IllegalStateException("lock " + Keys.show(g.slot.key()) + " was given back");
            }
            p = g.session.proclaim(g.slot, value);
        }
        Lockside.LeaseResponse r;
        try {
            r = awaitAnswer(p);
        } catch (Pending.Broken b) {
            if (g.lost) {
                throw g.lostException();
            }
            throw b.unavailable();
        }
        if (r == null) {
            throw new LocksideUnavailableException("the sidecar at " + address + " did not answer a proclaim in time");
        }
        if (r.getEventCase() == Lockside.LeaseResponse.EventCase.REJECTED) {
            if (g.lost) {
                throw g.lostException();
            }
            throw new LocksideRejectedException(g.slot.key(), r.getRejected().getCode(), r.getRejected().getMessage());
        }
    }

    /**
     * A release's or proclaim's answer, waited for uninterruptibly; null when none came
     * within 10 s of the session being open (a resume in between does not count).
     * Throws Broken when the session ended first (only for proclaims: a release whose
     * stream broke counts as done).
     */
    private Lockside.LeaseResponse awaitAnswer(Pending p) {
        long slice = TimeUnit.MILLISECONDS.toNanos(200);
        long openWaited = 0;
        while (true) {
            Lockside.LeaseResponse r;
            try {
                r = p.await(slice, false);
            } catch (Pending.Broken b) {
                if (p.kind == Pending.Kind.RELEASE) {
                    return null;
                }
                throw b;
            } catch (InterruptedException e) {
                throw new AssertionError(e); // not interruptible
            }
            if (r != null) {
                return r;
            }
            synchronized (mu) {
                if (p.session.state == Session.State.OPEN) {
                    openWaited += slice;
                }
            }
            if (openWaited >= ANSWER_SLACK_NANOS) {
                LOG.log(Level.WARNING, "lockside: no answer from the sidecar at {0} to a {1} of {2}", address,
                        p.kind, Keys.show(p.slot.key()));
                return null;
            }
        }
    }

    private static void sleepUninterruptibly(long nanos) {
        long until = System.nanoTime() + nanos;
        boolean interrupted = false;
        while (true) {
            long left = until - System.nanoTime();
            if (left <= 0) {
                break;
            }
            try {
                TimeUnit.NANOSECONDS.sleep(left);
            } catch (InterruptedException e) {
                interrupted = true;
            }
        }
        if (interrupted) {
            Thread.currentThread().interrupt();
        }
    }

    // -- what locks hear -------------------------------------------------------------

    /** The grant of `slot`, or null. */
    Grant grant(Slot slot) {
        synchronized (mu) {
            return grants.get(slot);
        }
    }

    /** The grant is gone (under the monitor): its holder is told, off the monitor. */
    void markLost(Grant g, String reason) {
        if (g.lost) {
            return;
        }
        g.lostReason = reason;
        g.lost = true;
        g.suspended = false;
        LockEvent e = g.event();
        LOG.log(Level.WARNING, "lockside: lock {0} of {1} lost: {2}", Keys.show(e.key()), e.holder(), reason);
        execute(() -> g.lostFuture.complete(null));
        fire(l -> l.onLost(e, reason));
        mu.notifyAll();
    }

    /** Calls the listener, if any, on the events thread. */
    void fire(Consumer<LockListener> call) {
        LockListener l = options.listener();
        if (l == null) {
            return;
        }
        execute(() -> {
            try {
                call.accept(l);
            } catch (RuntimeException e) {
                LOG.log(Level.WARNING, "lockside: a LockListener threw", e);
            }
        });
    }

    /** Runs `task` on the events thread; after close, here and now. */
    private void execute(Runnable task) {
        try {
            events.execute(task);
        } catch (java.util.concurrent.RejectedExecutionException e) {
            task.run();
        }
    }

    // -- closing ---------------------------------------------------------------------

    /**
     * Ends the session (the sidecar releases every lock of it at once) and the channel.
     * Locks still held count as lost.
     */
    void close() {
        Session s;
        synchronized (mu) {
            if (closed) {
                return;
            }
            closed = true;
            s = session;
            if (s != null) {
                s.close();
            }
            mu.notifyAll();
        }
        if (s != null) {
            try {
                s.ended.get(2, TimeUnit.SECONDS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            } catch (ExecutionException | TimeoutException e) {
                // ended below
            }
            synchronized (mu) {
                s.end("the client closed", false);
            }
        }
        channel.shutdown();
        try {
            if (!channel.awaitTermination(2, TimeUnit.SECONDS)) {
                channel.shutdownNow();
            }
        } catch (InterruptedException e) {
            channel.shutdownNow();
            Thread.currentThread().interrupt();
        }
        timers.shutdownNow();
        events.shutdown();
        if (group != null) {
            group.shutdownGracefully(0, 1, TimeUnit.SECONDS);
        }
    }

    boolean isClosed() {
        synchronized (mu) {
            return closed;
        }
    }
}
