package dev.singleton.fence;

import java.sql.SQLException;

/**
 * SQLSTATE {@code SF001} (MYSQL_ERRNO 31001): a newer run holds the fence (stale token), or this token
 * is retired because its period was decided.
 */
public class StaleTokenException extends FenceRefusedException {
    StaleTokenException(String sqlState, int errorCode, String message, SQLException cause) {
        super(sqlState, errorCode, message, cause);
    }
}
