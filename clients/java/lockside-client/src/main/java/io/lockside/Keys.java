package io.lockside;

/** How messages show keys: a bad 100 KB key is not repeated in full. */
final class Keys {
    private Keys() {}

    static String show(String key) {
        if (key == null) {
            return "null";
        }
        if (key.length() <= 80) {
            return "'" + key + "'";
        }
        return "'" + key.substring(0, 60) + "'... (" + key.length() + " characters)";
    }
}
