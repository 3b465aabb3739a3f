package dev.singleton.fence;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.io.IOException;
import java.sql.SQLException;
import org.junit.jupiter.api.Test;

class ExitCodeTest {
    private static FenceRefusedException refusal(String state, int errno) {
        return FenceRefusedException.from(
                new SQLException("(conn=12) stale fencing token 1 for job j: current is 2", state, errno));
    }

    @Test
    void codesOfTheChartsPodFailurePolicy() {
        assertEquals(0, ExitCode.of(null));
        assertEquals(1, ExitCode.of(new IOException("connection reset")));
        assertEquals(1, ExitCode.of(new SQLException("deadlock", "40P01")));
        assertEquals(2, ExitCode.of(new ConfigException("SINGLETON_JOB is not set")));
        assertEquals(2, ExitCode.of(new MisuseException("autocommit")));
        assertEquals(3, ExitCode.of(refusal("SF001", 0)));
        assertEquals(3, refusal("SF004", 0).exitCode());
    }

    @Test
    void looksThroughWrappers() {
        assertEquals(3, ExitCode.of(new RuntimeException("framework", refusal("SF002", 0))));
        assertEquals(2, ExitCode.of(new RuntimeException(new MisuseException("x"))));
        // A driver error that did not go through the library.
        assertEquals(3, ExitCode.of(new RuntimeException(new SQLException("refused", "SF003"))));
    }

    @Test
    void refusalsMapBySqlStateElseByErrno() {
        assertEquals(StaleTokenException.class, refusal("SF001", 31001).getClass());
        assertEquals(NotPermittedException.class, refusal("SF002", 0).getClass());
        assertEquals(NeverIssuedException.class, refusal("sf003", 0).getClass());
        assertEquals(AttemptSupersededException.class, refusal("SF004", 0).getClass());
        // Drivers that report their own SQLSTATE still carry MYSQL_ERRNO.
        assertEquals(StaleTokenException.class, refusal("HY000", 31001).getClass());
        assertEquals(NotPermittedException.class, refusal(null, 31002).getClass());
        assertEquals(NeverIssuedException.class, refusal("45000", 31003).getClass());
        assertEquals(AttemptSupersededException.class, refusal(null, 31004).getClass());
        FenceRefusedException e = refusal(null, 31004);
        assertEquals("SF004", e.sqlState());
        assertEquals(31004, e.errorCode());
        assertEquals(null, refusal("SF005", 0));
        assertEquals(null, refusal("23505", 1062));
    }

    @Test
    void messageIsTheServersText() {
        assertEquals("stale fencing token 1 for job j: current is 2", refusal("SF001", 31001).getMessage());
        assertEquals("role x may not fence job j", FenceRefusedException.serverMessage(
                "ERROR: role x may not fence job j\n  Hint: the job belongs to role postgres\n  Where: PL/pgSQL"));
        assertEquals("role x may not fence job j",
                FenceRefusedException.serverMessage("FEHLER: role x may not fence job j"));
    }
}
