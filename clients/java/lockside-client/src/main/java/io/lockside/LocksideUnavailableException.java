package io.lockside;

/**
 * The sidecar could not be reached (nothing listens at its address, or it does not
 * answer), or the session's stream broke while a request waited for its answer and the
 * request cannot be asked again for you (the sidecar does not resume waits in progress).
 */
public class LocksideUnavailableException extends LocksideException {
    private static final long serialVersionUID = 1L;

    public LocksideUnavailableException(String message) {
        super(message);
    }

    public LocksideUnavailableException(String message, Throwable cause) {
        super(message, cause);
    }
}
