package io.lockside;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import lockside.v1.Lockside;

/**
 * How a {@link LocksideMultiLock} takes its keys for the calling thread: one {@code
 * AcquireAll} of the keys the thread does not hold yet (a single {@code Acquire} when one
 * is left, as {@link LocksideLock}'s), one more hold of those it holds, the reader's
 * {@code GrantedAll} made into grants, and a request its caller stops waiting for given
 * back. The rules of one key ({@link Core#acquire}) for several.
 */
final class MultiAcquire {
    private final Core core;
    private final List<String> keys;
    private final LockOptions options;

    MultiAcquire(Core core, List<String> keys, LockOptions options) {
        this.core = core;
        this.keys = keys;
        this.options = options;
    }

    private Spec spec(String key) {
        return Spec.of(LocksideLock.currentHolder(), key, LockMode.EXCLUSIVE, 0, options);
    }

    /**
     * Takes every key the calling thread does not hold yet (one AcquireAll; a single
     * Acquire when one is left) and one more hold of those it holds, waiting up to
     * `waitNanos` ({@link Core#FOREVER}: as long as it takes). False when a key stayed
     * busy: then no hold was added to any key.
     */
    boolean acquire(long waitNanos, boolean interruptible) throws InterruptedException {
        final boolean forever = waitNanos == Core.FOREVER;
        final long started = System.nanoTime();
        final long deadline = started + (forever ? Long.MAX_VALUE / 2 : Math.min(Long.MAX_VALUE / 2, waitNanos));
        final boolean[] interrupted = {false};
        final String holder = LocksideLock.currentHolder();
        try {
            while (true) {
                // As Core.acquire: a release of one of the keys in this process that is
                // not answered yet, and that the sidecar would not order before this
                // request, comes first.
                for (String k : keys) {
                    Releasing.settled(k, core, holder, interruptible);
                }
                Pending p = null;
                List<String> missing;
                synchronized (core.mu) {
                    while (true) {
                        if (core.isClosed()) {
                            throw new IllegalStateException("the Lockside client is closed");
                        }
                        missing = new ArrayList<>();
                        boolean suspended = false;
                        for (String k : keys) {
                            Grant g = core.grants.get(new Slot(holder, k));
                            if (g == null) {
                                missing.add(k);
                                continue;
                            }
                            if (g.lost) {
                                throw new LockLostException(k, "this holder still holds the lock it lost ("
                                        + g.lostReason + "): unlock it first", g.fencingToken);
                            }
                            Core.checkReentry(g, spec(k));
                            suspended |= g.suspended;
                        }
                        if (suspended) { // one more hold once it is restored (or lost)
                            if (!waitOn(deadline, interruptible, interrupted)) {
                                return false;
                            }
                            continue;
                        }
                        if (missing.isEmpty()) {
                            holdTheRest(holder, missing, List.of());
                            return true;
                        }
                        if (missing.size() == 1) {
                            break; // an Acquire of one key, as LocksideLock's
                        }
                        Session s = core.usableSession();
                        if (s.state == Session.State.RESUMING) {
                            if (!waitOn(deadline, interruptible, interrupted)) {
                                return false;
                            }
                            continue;
                        }
                        long left = Math.max(0, deadline - System.nanoTime());
                        Duration wait = forever ? Wire.MAX_WAIT : Duration.ofNanos(Math.min(left, Wire.MAX_WAIT.toNanos()));
                        p = ask(s, holder, missing, wait);
                        break;
                    }
                }
                if (p == null) {
                    long left = forever ? Core.FOREVER : Math.max(0, deadline - System.nanoTime());
                    Grant g = core.acquire(spec(missing.get(0)), left, interruptible);
                    if (g == null) {
                        return false;
                    }
                    synchronized (core.mu) {
                        holdTheRest(holder, missing, List.of(g));
                    }
                    return true;
                }
                long answerWait = forever ? Wire.MAX_WAIT.toNanos()
                        : Math.min(Wire.MAX_WAIT.toNanos(), Math.max(0, deadline - System.nanoTime()));
                Lockside.LeaseResponse r;
                try {
                    r = answer(p, missing, answerWait, interruptible);
                } catch (Pending.Broken b) {
                    if (b.retry && (forever || deadline - System.nanoTime() > 0)) {
                        continue; // on the resumed session, or a new one
                    }
                    throw b.unavailable();
                }
                switch (r.getEventCase()) {
                    case GRANTED_ALL: {
                        synchronized (core.mu) {
                            holdTheRest(holder, missing, p.grants);
                        }
                        for (Grant g : p.grants) {
                            LockEvent e = g.event();
                            Duration waited = Duration.ofNanos(g.grantedNanos - started);
                            core.events.fire(l -> l.onAcquired(e, waited));
                        }
                        return true;
                    }
                    case NOT_ACQUIRED:
                        if (r.getNotAcquired().getReason() == Lockside.NotAcquired.Reason.REASON_TIMEOUT
                                && (forever || deadline - System.nanoTime() > Wire.MAX_WAIT.toNanos() / 2)) {
                            continue; // waited the sidecar's longest wait, and more is left: wait again
                        }
                        return false;
                    case REJECTED: {
                        Lockside.Rejected rej = r.getRejected();
                        String key = rej.getKey().isEmpty() ? String.join(", ", missing) : rej.getKey();
                        throw new LocksideRejectedException(key, rej.getCode(), rej.getMessage());
                    }
                    default:
                        throw new LocksideException("protocol error: " + r.getEventCase() + " answered an AcquireAll");
                }
            }
        } finally {
            if (interrupted[0]) {
                Thread.currentThread().interrupt();
            }
        }
    }

    /**
     * The keys of `missing` are granted (`granted`): one more hold of each key the thread
     * held before (under the monitor). If one of those was lost meanwhile, the new grants
     * are given back and its loss is thrown.
     */
    private void holdTheRest(String holder, List<String> missing, List<Grant> granted) {
        List<Grant> before = new ArrayList<>();
        for (String k : keys) {
            if (!missing.contains(k)) {
                Grant g = core.grants.get(new Slot(holder, k));
                if (g == null || g.lost) {
                    giveBack(granted);
                    throw g == null
                            ? new LockLostException(k, "given back while the other keys were asked for", 0)
                            : g.lostException();
                }
                before.add(g);
            }
        }
        for (Grant g : before) {
            g.add(LockMode.EXCLUSIVE);
        }
    }

    /** Gives back grants nobody will use, without waiting (under the monitor). */
    private void giveBack(List<Grant> grants) {
        for (Grant g : grants) {
            if (!g.lost && core.grants.get(g.slot) == g) {
                core.grants.remove(g.slot);
                g.session.held.remove(g.slot);
                if (g.session.state == Session.State.OPEN) {
                    g.session.giveBack(g.slot, 1);
                }
            }
        }
    }

    /** Sends an AcquireAll of `missing` on `s` (under the monitor). */
    private Pending ask(Session s, String holder, List<String> missing, Duration wait) {
        long id = core.nextId();
        Lockside.AcquireAll.Builder a = Lockside.AcquireAll.newBuilder()
                .setRequestId(id)
                .addAllKeys(missing)
                .setHolder(holder)
                .setMode(Lockside.LockMode.LOCK_MODE_EXCLUSIVE)
                .setFair(options.fair());
        if (!wait.isZero()) {
            a.setWaitTimeout(Wire.duration(wait));
        }
        if (options.ttl() != null) {
            a.setTtl(Wire.duration(options.ttl()));
        }
        Lockside.LeaseRequest request = Lockside.LeaseRequest.newBuilder().setAcquireAll(a).build();
        Pending p = new Pending(id, Pending.Kind.ACQUIRE, new Slot(holder, missing.get(0)), request, s);
        p.spec = spec(missing.get(0));
        p.grants = new ArrayList<>();
        s.pending.put(id, p);
        s.send(request);
        return p;
    }

    /** The reader's GrantedAll for `p` (under the monitor): a grant per key, in its order. */
    static void granted(Session session, Pending p, Lockside.GrantedAll all) {
        for (Lockside.Granted granted : all.getGrantsList()) {
            Slot slot = new Slot(p.slot.holder(), granted.getKey());
            Grant g = new Grant(slot, granted.getFencingToken(), LockMode.EXCLUSIVE, 0,
                    p.spec.ttl() != null ? p.spec.ttl() : session.defaultTtl, session);
            g.add(LockMode.EXCLUSIVE);
            session.held.put(slot, g);
            session.core.grants.put(slot, g);
            p.grants.add(g);
            if (granted.getHoldCount() > 1) {
                session.giveBack(slot, granted.getHoldCount() - 1); // holds nobody here knows of
            }
        }
    }

    /**
     * The answer to `p`, waited for up to `waitNanos` and the slack; a caller interrupted,
     * or left without an answer, abandons the request.
     */
    private Lockside.LeaseResponse answer(Pending p, List<String> missing, long waitNanos, boolean interruptible)
            throws InterruptedException {
        Lockside.LeaseResponse r;
        try {
            r = p.await(waitNanos + Answers.SLACK_NANOS, interruptible);
        } catch (InterruptedException e) {
            abandon(p, missing);
            throw e;
        }
        if (r == null) {
            abandon(p, missing);
            throw new LocksideUnavailableException("the sidecar at " + core.address
                    + " did not answer an AcquireAll of " + missing + " in time");
        }
        return r;
    }

    /**
     * The caller stopped waiting for `p`: a Release of each key asked for cancels the
     * wait (one is enough; the others are refused, not held) or, if the GrantedAll
     * crossed them, gives every grant back. A GrantedAll that already came is given back.
     */
    private void abandon(Pending p, List<String> missing) {
        synchronized (core.mu) {
            Session s = p.session;
            if (p.answer.isDone()) {
                giveBack(p.grants);
                return;
            }
            s.pending.remove(p.id);
            if (s.state == Session.State.OPEN) {
                for (String k : missing) {
                    s.giveBack(new Slot(p.slot.holder(), k), 1);
                }
            }
        }
    }

    /** Waits on the monitor until notified or `deadline`; false once it has passed. */
    private boolean waitOn(long deadline, boolean interruptible, boolean[] interrupted) throws InterruptedException {
        long left = deadline - System.nanoTime();
        if (left <= 0) {
            return false;
        }
        try {
            TimeUnit.NANOSECONDS.timedWait(core.mu, left);
        } catch (InterruptedException e) {
            if (interruptible) {
                throw e;
            }
            interrupted[0] = true;
        }
        return true;
    }
}
