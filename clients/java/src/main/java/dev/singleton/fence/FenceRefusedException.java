package dev.singleton.fence;

import java.sql.SQLException;
import java.util.Locale;

/**
 * The database refused this run (SQLSTATE {@code SF001} to {@code SF004}): it must stop without
 * committing and must not retry with the same token. Exit code 3. The driver's exception is the
 * cause. On PostgreSQL the transaction is aborted; on MariaDB/MySQL only the statement failed and
 * the transaction is still open, so whoever owns it must roll it back.
 */
public class FenceRefusedException extends SingletonException {
    private final String sqlState;
    private final int errorCode;

    FenceRefusedException(String sqlState, int errorCode, String message, SQLException cause) {
        super(message, cause);
        this.sqlState = sqlState;
        this.errorCode = errorCode;
    }

    /** {@code SF001} .. {@code SF004}. */
    public String sqlState() {
        return sqlState;
    }

    /** MariaDB/MySQL's {@code MYSQL_ERRNO} (31001 .. 31004); 0 on PostgreSQL. */
    public int errorCode() {
        return errorCode;
    }

    @Override
    public int exitCode() {
        return ExitCode.REFUSED;
    }

    /** The refusal this driver error is, or null when it is none. */
    static FenceRefusedException from(SQLException e) {
        String state = refusalState(e);
        if (state == null) {
            return null;
        }
        String message = serverMessage(e.getMessage());
        int code = e.getErrorCode();
        return switch (state) {
            case "SF001" -> new StaleTokenException(state, code, message, e);
            case "SF002" -> new NotPermittedException(state, code, message, e);
            case "SF003" -> new NeverIssuedException(state, code, message, e);
            case "SF004" -> new AttemptSupersededException(state, code, message, e);
            default -> new FenceRefusedException(state, code, message, e);
        };
    }

    /**
     * By SQLSTATE where the driver gives it, else by MYSQL_ERRNO, which the MariaDB/MySQL
     * functions set too because some drivers report their own SQLSTATE instead.
     */
    static String refusalState(SQLException e) {
        String state = e.getSQLState();
        if (state != null && state.toUpperCase(Locale.ROOT).matches("SF00[1-4]")) {
            return state.toUpperCase(Locale.ROOT);
        }
        int code = e.getErrorCode();
        if (code >= 31001 && code <= 31004) {
            return "SF00" + (code - 31000);
        }
        return null;
    }

    // The server's text without the drivers' decorations: PostgreSQL's "ERROR: " (localized) and
    // its Hint/Where lines, MariaDB's "(conn=N) ". The full text stays in the cause.
    static String serverMessage(String text) {
        if (text == null) {
            return "";
        }
        String s = text.strip();
        int nl = s.indexOf('\n');
        if (nl >= 0) {
            s = s.substring(0, nl).strip();
        }
        s = s.replaceFirst("^\\(conn=\\d+\\)\\s*", "");
        // The functions' messages start in lower case, so an upper-case word and a colon in
        // front of them is the severity.
        s = s.replaceFirst("^\\p{Lu}+:\\s+", "");
        return s;
    }
}
