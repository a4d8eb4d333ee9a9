package io.lockside;

import io.grpc.Status;
import java.net.ConnectException;

/** How a call's or a stream's ending is told: in words, and as this client's exceptions. */
final class Calls {
    private Calls() {}

    /** Failed calls (Describe, Watch) as this client's exceptions. */
    static LocksideException error(String key, Status status, String address) {
        switch (status.getCode()) {
            case UNAVAILABLE:
            case DEADLINE_EXCEEDED:
            case CANCELLED:
                return new LocksideUnavailableException(
                        "the sidecar at " + address + " did not answer: " + describe(status), status.asException());
            default:
                return new LocksideRejectedException(key, status.getCode().value(),
                        status.getDescription() == null ? "" : status.getDescription());
        }
    }

    /** Why the sidecar at `address` could not be reached, from the status the first stream ended with. */
    static String unreachable(ClientOptions options, Status status) {
        if (status.getCode() == Status.Code.UNAVAILABLE) {
            String why = describe(status);
            if (why.contains("Connection refused")) {
                why = "connection refused: nothing listens there";
            }
            return "no Lockside sidecar at " + options.address() + " (" + why + ")" + Probe.advice(options);
        }
        return "the sidecar at " + options.address() + " ended the session before it started: " + describe(status);
    }

    /** A stream ending in words: its status and what caused it. */
    static String describe(Status status) {
        StringBuilder b = new StringBuilder(status.getCode().name());
        if (status.getDescription() != null) {
            b.append(": ").append(status.getDescription());
        }
        for (Throwable c = status.getCause(); c != null; c = c.getCause()) {
            if (c instanceof ConnectException || c.getCause() == null) {
                b.append(" (").append(c.getMessage() != null ? c.getMessage() : c.getClass().getSimpleName())
                        .append(')');
                break;
            }
        }
        return b.toString();
    }
}
