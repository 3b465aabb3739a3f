package dev.singleton.fence;

import java.sql.SQLException;

/**
 * SQLSTATE {@code SF002} (MYSQL_ERRNO 31002): the database user or role may not fence this job (it
 * belongs to another role; see Privileges in docs/fencing.md).
 */
public class NotPermittedException extends FenceRefusedException {
    NotPermittedException(String sqlState, int errorCode, String message, SQLException cause) {
        super(sqlState, errorCode, message, cause);
    }
}
