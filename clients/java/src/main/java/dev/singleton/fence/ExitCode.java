package dev.singleton.fence;

import java.sql.SQLException;
import java.util.IdentityHashMap;
import java.util.Map;

/**
 * The exit codes of the chart's {@code podFailurePolicy} example: the Job retries on 1 and fails
 * at once on 2 and 3.
 *
 * <pre>{@code
 * public static void main(String[] args) {
 *     try {
 *         work();
 *     } catch (Throwable t) {
 *         t.printStackTrace();
 *         System.exit(ExitCode.of(t));
 *     }
 * }
 * }</pre>
 */
public final class ExitCode {
    /** Success. */
    public static final int OK = 0;
    /** Anything else: a retry may help (a lost connection, a deadlock, a bug). */
    public static final int RETRY = 1;
    /** Bad input, configuration or misuse: a retry would fail the same way. */
    public static final int BAD_INPUT = 2;
    /** Refused by the fence: this run must stop; do not retry (FailJob). */
    public static final int REFUSED = 3;

    private ExitCode() {}

    /**
     * The exit code for an error ({@code null}: success). Looks through causes, so a refusal that
     * a framework wrapped (or a driver error with SQLSTATE SF001..SF004 that did not go through
     * this library) still gives 3.
     */
    public static int of(Throwable error) {
        if (error == null) {
            return OK;
        }
        Map<Throwable, Boolean> seen = new IdentityHashMap<>();
        for (Throwable t = error; t != null && seen.put(t, Boolean.TRUE) == null; t = t.getCause()) {
            if (t instanceof SingletonException s) {
                return s.exitCode();
            }
            if (t instanceof SQLException e && FenceRefusedException.refusalState(e) != null) {
                return REFUSED;
            }
        }
        return RETRY;
    }
}
