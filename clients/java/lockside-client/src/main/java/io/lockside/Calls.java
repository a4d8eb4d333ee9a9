package io.lockside;

import io.grpc.Status;

/** Failed calls (Describe, Watch) as this client's exceptions. */
final class Calls {
    private Calls() {}

    static LocksideException error(String key, Status status, String address) {
        switch (status.getCode()) {
            case UNAVAILABLE:
            case DEADLINE_EXCEEDED:
            case CANCELLED:
                return new LocksideUnavailableException(
                        "the sidecar at " + address + " did not answer: " + Session.describe(status), status.asException());
            default:
                return new LocksideRejectedException(key, status.getCode().value(),
                        status.getDescription() == null ? "" : status.getDescription());
        }
    }
}
