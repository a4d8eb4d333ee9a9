package io.lockside;

import io.grpc.Status;
import lockside.v1.Lockside;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * What the sidecar says on a {@link Session}'s stream, routed (under the client's
 * monitor): a stream's greeting, answers to the requests waiting for them, Lost and
 * Jeopardy for held locks, and the stream's end. Messages and endings of a stream that
 * is no longer the session's are dropped.
 */
final class Inbox {
    private static final Logger LOG = LoggerFactory.getLogger("io.lockside");

    private final Session session;

    Inbox(Session session) {
        this.session = session;
    }

    /**
     * A message on `s`: first SessionStarted; on a resumed stream, then a Granted (request
     * id 0) or Lost for each lock of the session's record; then answers and events.
     */
    void message(LeaseStream s, Lockside.LeaseResponse r) {
        if (s != session.stream || s.done) {
            return;
        }
        if (s.greetingLeft < 0) {
            if (r.getEventCase() != Lockside.LeaseResponse.EventCase.STARTED) {
                s.cancel("protocol error: the stream opened with " + r.getEventCase() + ", not SessionStarted");
                return;
            }
            Lockside.SessionStarted st = r.getStarted();
            if (!s.resume) {
                s.greetingLeft = 0;
                session.opened(st);
                return;
            }
            s.startedMessage = st;
            s.greetingLeft = st.getResumedLocks();
            if (s.greetingLeft == 0) {
                session.resumption.resumed(s);
            }
            return;
        }
        if (s.greetingLeft > 0) {
            s.greeting.add(r);
            if (--s.greetingLeft == 0) {
                session.resumption.resumed(s);
            }
            return;
        }
        dispatch(r);
    }

    private void dispatch(Lockside.LeaseResponse r) {
        switch (r.getEventCase()) {
            case GRANTED:
            case GRANTED_ALL:
            case NOT_ACQUIRED:
            case RELEASED:
            case REJECTED:
            case PROCLAIMED:
                answered(r);
                break;
            case LOST: {
                Lockside.Lost l = r.getLost();
                Grant g = session.held.remove(new Slot(l.getHolder(), l.getKey()));
                if (g != null) {
                    session.core.markLost(g, l.getReason().isEmpty() ? "the sidecar sent Lost" : l.getReason());
                }
                break;
            }
            case JEOPARDY: {
                Lockside.Jeopardy j = r.getJeopardy();
                LOG.warn("lockside: lock {} of {} in jeopardy: renewals failing, {} of validity left",
                        Keys.show(j.getKey()), j.getHolder(), Wire.duration(j.getTtlRemaining()));
                break;
            }
            case RESTORED:
                LOG.info("lockside: renewals of {} succeed again", Keys.show(r.getRestored().getKey()));
                break;
            default:
                break; // Waiting, and anything newer than this client
        }
    }

    /** Routes an answer to the request it answers. */
    private void answered(Lockside.LeaseResponse r) {
        Pending p = session.pending.remove(Wire.answerId(r));
        if (p == null) {
            // The answer to a request sent without waiting (giveBack), or to an acquire
            // its caller abandoned (the Release sent after it settles the key).
            return;
        }
        if (r.getEventCase() == Lockside.LeaseResponse.EventCase.GRANTED_ALL && p.grants != null) {
            MultiAcquire.granted(session, p, r.getGrantedAll());
        } else if (r.getEventCase() == Lockside.LeaseResponse.EventCase.GRANTED && p.kind == Pending.Kind.ACQUIRE
                && p.grants == null) {
            Lockside.Granted granted = r.getGranted();
            Spec spec = p.spec;
            Grant g = new Grant(p.slot, granted.getFencingToken(), spec.mode(), spec.limit(),
                    spec.ttl() != null ? spec.ttl() : session.defaultTtl, session);
            g.add(spec.mode());
            session.held.put(p.slot, g);
            session.core.grants.put(p.slot, g);
            p.grant = g;
            if (granted.getHoldCount() > 1) {
                // Holds nobody here knows of (a Release that never got through): the
                // sidecar's count is the truth; keep one.
                session.giveBack(p.slot, granted.getHoldCount() - 1);
            }
        }
        p.answer.complete(r);
    }

    /** `s` ended with `status`: what that means depends on how far the session got. */
    void end(LeaseStream s, Status status) {
        if (s != session.stream || s.done) {
            s.done = true;
            return;
        }
        s.done = true;
        if (s.startTimer != null) {
            s.startTimer.cancel(false);
        }
        switch (session.state) {
            case STARTING:
                session.firstStreamEnded(status);
                break;
            case OPEN:
                session.resumption.broke(status);
                break;
            case RESUMING:
                session.resumption.attemptFailed(status, s.refused);
                break;
            default:
                break;
        }
    }
}
