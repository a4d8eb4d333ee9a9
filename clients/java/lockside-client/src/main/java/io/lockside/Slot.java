package io.lockside;

/**
 * Where the client keeps one holder's grant of one key: the sidecar's reentrancy is per
 * (session, holder, key), and every answer and event about a grant names both.
 */
record Slot(String holder, String key) {}
