package io.lockside;

import com.google.protobuf.ByteString;
import java.time.Duration;
import lockside.v1.Lockside;

/** Requests as the sidecar reads them, and its durations as Java's. */
final class Wire {
    private Wire() {}

    /** The longest wait the sidecar accepts: a wait "for as long as it takes" asks this. */
    static final Duration MAX_WAIT = Duration.ofHours(24);

    static Lockside.LeaseRequest acquire(long id, Spec spec, Duration wait) {
        Lockside.Acquire.Builder a = Lockside.Acquire.newBuilder()
                .setRequestId(id)
                .setKey(spec.key())
                .setHolder(spec.holder())
                .setMode(spec.mode() == LockMode.SHARED
                        ? Lockside.LockMode.LOCK_MODE_SHARED
                        : Lockside.LockMode.LOCK_MODE_EXCLUSIVE)
                .setLimit(spec.limit())
                .setFair(spec.fair());
        if (!wait.isZero()) {
            a.setWaitTimeout(duration(wait));
        }
        if (spec.ttl() != null) {
            a.setTtl(duration(spec.ttl()));
        }
        if (spec.value().length > 0) {
            a.setValue(ByteString.copyFrom(spec.value()));
        }
        return Lockside.LeaseRequest.newBuilder().setAcquire(a).build();
    }

    static Lockside.LeaseRequest release(long id, Slot slot) {
        return Lockside.LeaseRequest.newBuilder()
                .setRelease(Lockside.Release.newBuilder()
                        .setRequestId(id)
                        .setKey(slot.key())
                        .setHolder(slot.holder()))
                .build();
    }

    static Lockside.LeaseRequest proclaim(long id, Slot slot, byte[] value) {
        return Lockside.LeaseRequest.newBuilder()
                .setProclaim(Lockside.Proclaim.newBuilder()
                        .setRequestId(id)
                        .setKey(slot.key())
                        .setHolder(slot.holder())
                        .setValue(ByteString.copyFrom(value)))
                .build();
    }

    static com.google.protobuf.Duration duration(Duration d) {
        return com.google.protobuf.Duration.newBuilder()
                .setSeconds(d.getSeconds())
                .setNanos(d.getNano())
                .build();
    }

    static Duration duration(com.google.protobuf.Duration d) {
        return Duration.ofSeconds(d.getSeconds(), d.getNanos());
    }

    /** The request id an answer carries, or -1 for an event that answers nothing. */
    static long answerId(Lockside.LeaseResponse r) {
        switch (r.getEventCase()) {
            case GRANTED:
                return r.getGranted().getRequestId();
            case GRANTED_ALL:
                return r.getGrantedAll().getRequestId();
            case NOT_ACQUIRED:
                return r.getNotAcquired().getRequestId();
            case RELEASED:
                return r.getReleased().getRequestId();
            case REJECTED:
                return r.getRejected().getRequestId();
            case PROCLAIMED:
                return r.getProclaimed().getRequestId();
            default:
                return -1;
        }
    }
}
