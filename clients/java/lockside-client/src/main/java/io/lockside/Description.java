package io.lockside;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Comparator;
import java.util.List;
import java.util.Optional;
import lockside.v1.Lockside;

/**
 * The store's view of one key: {@link LocksideClient#describe} and each state of a
 * {@link LockWatch}.
 *
 * @param key          the key
 * @param mode         how its holders hold it; {@link LockMode#UNSPECIFIED} when nobody does
 * @param limit        1 for a lock, N for a semaphore of N permits, 0 when nobody holds it
 * @param holders      the current grants
 * @param waiters      how many requests wait for it on the store
 * @param fencingToken the last token issued for the key (0 if none ever was)
 * @param queue        the fair waiters, next in line first
 */
public record Description(String key, LockMode mode, int limit, List<Holder> holders, int waiters,
        long fencingToken, List<Waiter> queue) {

    /**
     * One grant of the key.
     *
     * @param sessionId    the holding session
     * @param holder       the holder inside it ("thread-12", "permit-3", ...; "" for the session)
     * @param holdCount    how many times it holds the key
     * @param ttlRemaining how long the store keeps it if nobody renews it
     * @param clientName   the session's {@code lockside-client-name}
     * @param value        the holder's value: in an election, the leader's name or address
     * @param fencingToken the token of this grant
     */
    public record Holder(String sessionId, String holder, int holdCount, Duration ttlRemaining, String clientName,
            byte[] value, long fencingToken) {
        /** {@link #value()} as UTF-8 text. */
        public String valueString() {
            return new String(value, StandardCharsets.UTF_8);
        }
    }

    /** One fair waiter; position 1 is next in line. */
    public record Waiter(String sessionId, String holder, String clientName, LockMode mode, int position) {}

    /** The leader of an election key: the oldest grant (lowest token); empty when nobody leads. */
    public Optional<Holder> leader() {
        return holders.stream().min(Comparator.comparingLong(Holder::fencingToken));
    }

    static Description of(Lockside.DescribeResponse r) {
        return new Description(
                r.getKey(),
                mode(r.getMode()),
                r.getLimit(),
                r.getHoldersList().stream()
                        .map(h -> new Holder(h.getSessionId(), h.getHolder(), h.getHoldCount(),
                                Wire.duration(h.getTtlRemaining()), h.getClientName(), h.getValue().toByteArray(),
                                h.getFencingToken()))
                        .toList(),
                r.getWaiters(),
                r.getFencingToken(),
                r.getQueueList().stream()
                        .map(q -> new Waiter(q.getSessionId(), q.getHolder(), q.getClientName(), mode(q.getMode()),
                                q.getPosition()))
                        .toList());
    }

    private static LockMode mode(Lockside.LockMode m) {
        switch (m) {
            case LOCK_MODE_EXCLUSIVE:
                return LockMode.EXCLUSIVE;
            case LOCK_MODE_SHARED:
                return LockMode.SHARED;
            default:
                return LockMode.UNSPECIFIED;
        }
    }
}
