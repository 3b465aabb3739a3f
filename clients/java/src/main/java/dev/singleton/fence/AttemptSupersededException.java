package dev.singleton.fence;

import java.sql.SQLException;

/**
 * SQLSTATE {@code SF004} (MYSQL_ERRNO 31004): a newer attempt (pod) of this run registered, or this
 * attempt never called {@link Fence#register}.
 */
public class AttemptSupersededException extends FenceRefusedException {
    AttemptSupersededException(String sqlState, int errorCode, String message, SQLException cause) {
        super(sqlState, errorCode, message, cause);
    }
}
