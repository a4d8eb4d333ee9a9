package io.lockside;

import java.nio.charset.StandardCharsets;

/**
 * Leadership of an election key, from {@link LocksideClient#campaign}: a fair exclusive
 * lock whose value names the leader for every follower ({@link LocksideClient#describe},
 * {@link LocksideClient#watch}). {@link #close()} resigns (once; later calls do nothing);
 * when it is {@link #lost()}, stop acting as the leader, and while it is {@link
 * #isSuspended() suspended}, act as a follower until it is restored.
 */
public final class Leadership extends HeldGrant {
    Leadership(Core core, Grant grant) {
        super(core, grant);
    }

    /** Replaces the leader's value (a new address, say) without giving up leadership. */
    public void proclaim(byte[] value) {
        core.proclaim(grant, value.clone());
    }

    /** {@link #proclaim(byte[])} in UTF-8. */
    public void proclaim(String value) {
        proclaim(value.getBytes(StandardCharsets.UTF_8));
    }
}
