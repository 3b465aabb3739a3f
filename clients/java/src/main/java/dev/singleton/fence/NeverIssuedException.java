package dev.singleton.fence;

import java.sql.SQLException;

/**
 * SQLSTATE {@code SF003} (MYSQL_ERRNO 31003): the controller never issued this token for this job (no
 * fence row in this database and table prefix, or a token above the newest).
 */
public class NeverIssuedException extends FenceRefusedException {
    NeverIssuedException(String sqlState, int errorCode, String message, SQLException cause) {
        super(sqlState, errorCode, message, cause);
    }
}
