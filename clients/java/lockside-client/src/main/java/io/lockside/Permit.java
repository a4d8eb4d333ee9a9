package io.lockside;

/**
 * One permit of a {@link LocksideSemaphore}: a holder of its own inside the session, so
 * any thread may give it back. {@link #close()} gives it back (once; later calls do
 * nothing).
 */
public final class Permit extends HeldGrant {
    Permit(Core core, Grant grant) {
        super(core, grant);
    }
}
