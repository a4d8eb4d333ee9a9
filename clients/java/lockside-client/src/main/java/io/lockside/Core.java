package io.lockside;

import java.time.Duration;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import lockside.v1.Lockside;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * What a {@link LocksideClient} shares among its locks, and what a holder does with a
 * lock: the current session, every grant not yet given back, by (holder, key), and the
 * transitions of a grant (acquired, held again, suspended, released, lost). One monitor
 * ({@link #mu}) guards all of it; callers wait for their own request's answer outside
 * it ({@link Answers}).
 */
final class Core {
    private static final Logger LOG = LoggerFactory.getLogger("io.lockside");

    /** A wait "for as long as it takes". */
    static final long FOREVER = -1;
    /** About 146 years: "no deadline" without overflowing nanoTime arithmetic. */
    private static final long FAR_NANOS = Long.MAX_VALUE / 2;

    final Object mu = new Object();
    final ClientOptions options;
    final String address;
    final Transport transport;
    final ScheduledExecutorService timers;
    /** Where listeners and lost futures are called: never under the monitor. */
    final Events events;
    private final Answers answers = new Answers(this);
    /** Waits for the answers of releases, which unlock() does not wait for. */
    private final ExecutorService releases = Executors.newSingleThreadExecutor(Transport.daemon("lockside-releases"));
    /** Every grant not yet given back (lost ones too, until their holder unlocks). */
    final Map<Slot, Grant> grants = new HashMap<>();
    private Session session;
    private long nextId = 1;
    private boolean closed;

    Core(ClientOptions options) {
        this.options = options;
        this.address = options.address();
        transport = new Transport(address);
        ScheduledThreadPoolExecutor t = new ScheduledThreadPoolExecutor(1, Transport.daemon("lockside-timers"));
        t.setRemoveOnCancelPolicy(true);
        timers = t;
        events = new Events(options.listener());
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
            transport.reconnectNow();
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
        transport.reconnectNow();
        session = new Session(this);
        session.start(patient);
        return session;
    }

    /** See {@link Transport#reconnectNow}. */
    void reconnectNow() {
        transport.reconnectNow();
    }

    /**
     * The session to send a request on (under the monitor): the current one, or a new
     * one once it ended. It may be resuming: then the caller waits.
     */
    Session usableSession() {
        Session s = session;
        return s == null || s.state == Session.State.ENDED ? openSession(true) : s;
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
        final long started = System.nanoTime();
        // A wait of years (tryLock(Long.MAX_VALUE, ...)) is capped: no nanoTime overflow.
        final long deadline = System.nanoTime() + (forever ? FAR_NANOS : Math.min(FAR_NANOS, Math.max(0, waitNanos)));
        final boolean[] interrupted = {false};
        try {
            while (true) {
                // A release of the key in this process that is not answered yet, and that
                // the sidecar would not order before this request, comes first.
                Releasing.settled(spec.key(), this, spec.slot().holder(), interruptible);
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
                        // The sidecar waits at most MAX_WAIT at a time; a longer wait asks again.
                        long left = Math.max(0, deadline - System.nanoTime());
                        Duration wait = forever ? Wire.MAX_WAIT : Duration.ofNanos(Math.min(left, Wire.MAX_WAIT.toNanos()));
                        p = s.acquire(spec, wait);
                        break;
                    }
                }
                long answerWait = forever ? Wire.MAX_WAIT.toNanos()
                        : Math.min(Wire.MAX_WAIT.toNanos(), Math.max(0, deadline - System.nanoTime()));
                Lockside.LeaseResponse r;
                try {
                    r = answers.acquire(p, answerWait, interruptible);
                } catch (Pending.Broken b) {
                    if (b.retry && (forever || deadline - System.nanoTime() > 0)) {
                        continue; // on the resumed session, or a new one
                    }
                    throw b.unavailable();
                }
                switch (r.getEventCase()) {
                    case GRANTED: {
                        Grant g = p.grant;
                        LockEvent e = g.event();
                        Duration waited = Duration.ofNanos(g.grantedNanos - started);
                        events.fire(l -> l.onAcquired(e, waited));
                        return g;
                    }
                    case NOT_ACQUIRED:
                        if (r.getNotAcquired().getReason() == Lockside.NotAcquired.Reason.REASON_TIMEOUT
                                && (forever || deadline - System.nanoTime() > Wire.MAX_WAIT.toNanos() / 2)) {
                            continue; // waited the sidecar's longest wait, and more is left: wait again
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
    static void checkReentry(Grant g, Spec spec) {
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
            LockEvent e = g.event();
            Duration held = Duration.ofNanos(System.nanoTime() - g.grantedNanos);
            events.fire(l -> l.onReleased(e, held));
            Session s = g.session;
            s.held.remove(slot);
            if (s.state != Session.State.OPEN) {
                // Resuming: the resumed session lists it and it is given back then; ended:
                // the sidecar released it with the stream.
                return;
            }
            p = s.release(slot);
        }
        // Returns once the Release is on the stream; its answer is waited for (and a
        // release the store could not take asked again) on the releases' thread, and
        // what this process asks of the key meanwhile waits for it (Releasing).
        Releasing.Entry inFlight = Releasing.sent(slot.key(), this, slot.holder());
        Pending sent = p;
        try {
            releases.execute(() -> {
                try {
                    answers.release(sent);
                } finally {
                    Releasing.done(inFlight);
                }
            });
        } catch (RejectedExecutionException closed) {
            Releasing.done(inFlight); // the client closed: its session released everything
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
            r = answers.await(p);
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
        LOG.warn("lockside: lock {} of {} lost: {}", Keys.show(e.key()), e.holder(), reason);
        events.execute(() -> g.lostFuture.complete(null));
        events.fire(l -> l.onLost(e, reason));
        mu.notifyAll();
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
        transport.close();
        releases.shutdown();
        timers.shutdownNow();
        events.close();
    }

    /** Where the client's session is now. */
    SessionState state() {
        synchronized (mu) {
            if (closed) {
                return SessionState.CLOSED;
            }
            if (session == null) {
                return SessionState.ENDED;
            }
            switch (session.state) {
                case STARTING:
                    return SessionState.CONNECTING;
                case OPEN:
                    return SessionState.OPEN;
                case RESUMING:
                    return SessionState.RESUMING;
                default:
                    return SessionState.ENDED;
            }
        }
    }

    /** How many grants are held now (not lost), and how many of them are suspended. */
    int[] heldAndSuspended() {
        synchronized (mu) {
            int held = 0;
            int suspended = 0;
            for (Grant g : grants.values()) {
                if (!g.lost) {
                    held++;
                    if (g.suspended) {
                        suspended++;
                    }
                }
            }
            return new int[] {held, suspended};
        }
    }

    boolean isClosed() {
        synchronized (mu) {
            return closed;
        }
    }
}
