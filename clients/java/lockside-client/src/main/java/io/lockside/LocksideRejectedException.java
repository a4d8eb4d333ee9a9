package io.lockside;

/**
 * The sidecar refused a request: a bad value ({@code code} 3 INVALID_ARGUMENT), a limit
 * reached (8 RESOURCE_EXHAUSTED), a conflicting mode or limit (9 FAILED_PRECONDITION),
 * an unsupported request (12 UNIMPLEMENTED) or a store it cannot reach (14
 * UNAVAILABLE). The session and its other locks go on.
 */
public class LocksideRejectedException extends LocksideException {
    private static final long serialVersionUID = 1L;

    private final String key;
    private final int code;
    private final String detail;

    public LocksideRejectedException(String key, int code, String detail) {
        super("request for " + Keys.show(key) + " rejected: " + codeName(code) + " (" + code + "): " + detail);
        this.key = key;
        this.code = code;
        this.detail = detail;
    }

    /** The key of the refused request. */
    public String key() {
        return key;
    }

    /** A google.rpc.Code number. */
    public int code() {
        return code;
    }

    /** The name of {@link #code()}, e.g. "FAILED_PRECONDITION". */
    public String codeName() {
        return codeName(code);
    }

    /** What the sidecar said was wrong. */
    public String detail() {
        return detail;
    }

    static String codeName(int code) {
        io.grpc.Status.Code c = io.grpc.Status.fromCodeValue(code).getCode();
        return c.value() == code ? c.name() : "UNKNOWN_CODE";
    }
}
