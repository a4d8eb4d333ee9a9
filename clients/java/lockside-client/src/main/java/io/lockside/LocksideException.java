package io.lockside;

/** Base class of every exception this client throws (all unchecked). */
public class LocksideException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    public LocksideException(String message) {
        super(message);
    }

    public LocksideException(String message, Throwable cause) {
        super(message, cause);
    }
}
