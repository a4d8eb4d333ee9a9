package io.lockside;

/** Where a {@link LocksideClient}'s session is: {@link LocksideClient#sessionState()}. */
public enum SessionState {
    /** The session's stream is open; the sidecar has not greeted it yet. */
    CONNECTING,
    /** The session is open: its locks are held and renewed. */
    OPEN,
    /**
     * The stream broke and the client is resuming the session: every held lock is
     * suspended (stop using it) until it is restored or lost.
     */
    RESUMING,
    /** No session now (the last one ended, its locks lost): the next lock opens a new one. */
    ENDED,
    /** {@link LocksideClient#close()} was called. */
    CLOSED
}
