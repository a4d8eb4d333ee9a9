package io.lockside;

/**
 * The lock was lost while held: the sidecar sent {@code Lost} (renewals were not
 * confirmed in time), or the session's stream broke and the session was not resumed
 * with the lock in it. Thrown by {@code unlock()} (and {@code close()}) of a lock lost
 * before it: work done under the lock after the loss may have overlapped with another
 * holder's; the fencing token is what protects the resource then.
 */
public class LockLostException extends LocksideException {
    private static final long serialVersionUID = 1L;

    private final String key;
    private final String reason;
    private final long fencingToken;

    public LockLostException(String key, String reason, long fencingToken) {
        super("lock " + Keys.show(key) + " lost: " + reason);
        this.key = key;
        this.reason = reason;
        this.fencingToken = fencingToken;
    }

    public String key() {
        return key;
    }

    /** Why, in words. */
    public String reason() {
        return reason;
    }

    /** The fencing token of the grant that was lost. */
    public long fencingToken() {
        return fencingToken;
    }
}
