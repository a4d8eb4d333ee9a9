package io.lockside;

/** How a key is held. */
public enum LockMode {
    /** Excludes every other holder, of this session or another. */
    EXCLUSIVE,
    /** Coexists with other SHARED holders; excludes EXCLUSIVE ones. */
    SHARED
}
