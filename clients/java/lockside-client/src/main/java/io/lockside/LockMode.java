package io.lockside;

/** How a key is held (the proto's {@code LockMode}). */
public enum LockMode {
    /** Nobody holds the key: the mode of a {@link Description} with no holders. Never asked for. */
    UNSPECIFIED,
    /** Excludes every other holder, of this session or another. */
    EXCLUSIVE,
    /** Coexists with other SHARED holders; excludes EXCLUSIVE ones. */
    SHARED
}
