package dev.singleton.fence;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.SQLException;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.stream.Stream;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.TestInstance;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.MethodSource;

/** Every case on both engines, against real servers (DATABASE_URL, MARIADB_URL). */
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
class FenceTest {
    private Db postgres;
    private Db mariadb;
    private final AtomicInteger jobs = new AtomicInteger();

    @BeforeAll
    void databases() throws Exception {
        postgres = Db.postgres();
        mariadb = Db.mariadb();
    }

    @AfterAll
    void drop() throws Exception {
        if (postgres != null) {
            postgres.drop();
        }
        if (mariadb != null) {
            mariadb.drop();
        }
    }

    Stream<Db> engines() {
        return Stream.of(postgres, mariadb);
    }

    /** A job of its own per test, so the cases do not see each other's fences. */
    private String job() {
        return "tests/job-" + jobs.incrementAndGet();
    }

    private static void insert(Connection c, String job, String note) throws SQLException {
        try (PreparedStatement ps = c.prepareStatement("INSERT INTO items (job, note) VALUES (?, ?)")) {
            ps.setString(1, job);
            ps.setString(2, note);
            ps.executeUpdate();
        }
    }

    @ParameterizedTest(name = "{0}")
    @MethodSource("engines")
    void engineIsDetectedFromTheDriver(Db db) throws SQLException {
        assertEquals(db.engine(), Fence.Engine.of(db.connect()));
    }

    @ParameterizedTest(name = "{0}")
    @MethodSource("engines")
    void registeredAttemptFencesAndCommits(Db db) throws SQLException {
        String job = job();
        db.issue(job, 42);
        Fence fence = new Fence(Run.of(job, 42, "pod-a"));
        Connection c = db.connect();
        assertEquals(1, fence.register(c));
        assertEquals(1, fence.register(c), "the same attempt registering again gets its number again");

        long token = fence.inTransaction(c, tx -> {
            insert(tx, job, "written under the fence");
            return fence.run().token();
        });
        assertEquals(42, token);
        assertEquals(1, db.items(job));
        assertTrue(c.getAutoCommit(), "inTransaction leaves the connection in autocommit mode");

        // Transaction after transaction of the same attempt.
        fence.inTransaction(c, tx -> {
            insert(tx, job, "second");
            return null;
        });
        assertEquals(2, db.items(job));
    }

    @ParameterizedTest(name = "{0}")
    @MethodSource("engines")
    void fenceJoinsATransactionSomeoneElseOpened(Db db) throws SQLException {
        // What a Spring @Transactional method sees: the transaction manager turned autocommit off.
        String job = job();
        db.issue(job, 7);
        Fence fence = new Fence(Run.of(job, 7, "pod-a"));
        Connection c = db.connect();
        fence.register(c);
        c.setAutoCommit(false);
        assertEquals(7, fence.fence(c));
        insert(c, job, "caller's transaction");
        assertEquals(0, db.items(job), "not committed yet");
        c.commit();
        assertEquals(1, db.items(job));
    }

    @ParameterizedTest(name = "{0}")
    @MethodSource("engines")
    void staleTokenIsRefusedAndNothingCommits(Db db) throws SQLException {
        String job = job();
        db.issue(job, 41);
        Fence fence = new Fence(Run.of(job, 41, "pod-a"));
        Connection c = db.connect();
        fence.register(c);
        fence.inTransaction(c, tx -> {
            insert(tx, job, "while current");
            return null;
        });
        db.issue(job, 42); // the controller started the next run

        AtomicBoolean ran = new AtomicBoolean();
        StaleTokenException e = assertThrows(StaleTokenException.class, () -> fence.inTransaction(c, tx -> {
            ran.set(true);
            insert(tx, job, "must not commit");
            return null;
        }));
        assertFalse(ran.get(), "the fence comes first: the work never ran");
        assertEquals("SF001", e.sqlState());
        assertEquals("stale fencing token 41 for job " + job + ": current is 42", e.getMessage());
        assertEquals(db.engine() == Fence.Engine.MARIADB ? 31001 : 0, e.errorCode());
        assertInstanceOf(SQLException.class, e.getCause());
        assertEquals(ExitCode.REFUSED, ExitCode.of(e));
        assertEquals(1, db.items(job));
        assertTrue(c.getAutoCommit());
        assertEquals(1, db.count("SELECT 1"), "the connection is still usable");
    }

    @ParameterizedTest(name = "{0}")
    @MethodSource("engines")
    void refusalInTheCallersTransactionLeavesTheRollbackToTheCaller(Db db) throws SQLException {
        String job = job();
        db.issue(job, 5);
        Fence fence = new Fence(Run.of(job, 5, "pod-a"));
        Connection c = db.connect();
        fence.register(c);
        db.issue(job, 6);
        c.setAutoCommit(false);
        assertThrows(StaleTokenException.class, () -> fence.fence(c));
        c.rollback();
        assertEquals(0, db.items(job));
    }

    @ParameterizedTest(name = "{0}")
    @MethodSource("engines")
    void retiredTokenIsStale(Db db) throws SQLException {
        String job = job();
        db.issue(job, 9);
        Fence fence = new Fence(Run.of(job, 9, "pod-a"));
        Connection c = db.connect();
        fence.register(c);
        db.retire(job, 9); // its period was decided

        StaleTokenException e = assertThrows(StaleTokenException.class, () -> fence.inTransaction(c, tx -> {
            insert(tx, job, "must not commit");
            return null;
        }));
        assertEquals("fencing token 9 for job " + job + " is retired: its period was decided", e.getMessage());
        assertEquals(0, db.items(job));
        assertThrows(StaleTokenException.class, () -> fence.register(c));
    }

    @ParameterizedTest(name = "{0}")
    @MethodSource("engines")
    void tokenNeverIssued(Db db) throws SQLException {
        Connection c = db.connect();
        String nobody = job(); // no fence row at all
        NeverIssuedException none = assertThrows(NeverIssuedException.class,
                () -> new Fence(Run.of(nobody, 1, "pod-a")).register(c));
        assertEquals("SF003", none.sqlState());
        assertEquals(ExitCode.REFUSED, ExitCode.of(none));
        assertEquals(0, db.count("SELECT count(*) FROM singleton_fences WHERE job = ?", nobody), "no row is created");

        String job = job();
        db.issue(job, 10);
        Fence above = new Fence(Run.of(job, 11, "pod-a"));
        NeverIssuedException e = assertThrows(NeverIssuedException.class, () -> above.register(c));
        assertEquals("fencing token 11 for job " + job + " was never issued: the newest is 10", e.getMessage());
        assertThrows(NeverIssuedException.class, () -> above.inTransaction(c, tx -> null));
        assertEquals(10, db.count("SELECT token FROM singleton_fences WHERE job = ?", job), "the fence did not move");
    }

    @ParameterizedTest(name = "{0}")
    @MethodSource("engines")
    void olderAttemptIsSuperseded(Db db) throws SQLException {
        String job = job();
        db.issue(job, 3);
        Fence a = new Fence(Run.of(job, 3, "pod-a"));
        Fence b = new Fence(Run.of(job, 3, "pod-b"));
        Connection ca = db.connect();
        Connection cb = db.connect();
        assertEquals(1, a.register(ca));
        assertEquals(2, b.register(cb));

        AttemptSupersededException e = assertThrows(AttemptSupersededException.class, () -> a.inTransaction(ca, tx -> {
            insert(tx, job, "older pod");
            return null;
        }));
        assertEquals("SF004", e.sqlState());
        assertEquals(ExitCode.REFUSED, ExitCode.of(e));
        assertEquals(0, db.items(job));
        assertThrows(AttemptSupersededException.class, () -> a.register(ca), "an older pod cannot come back");

        b.inTransaction(cb, tx -> {
            insert(tx, job, "newest pod");
            return null;
        });
        assertEquals(1, db.items(job));
    }

    @ParameterizedTest(name = "{0}")
    @MethodSource("engines")
    void unregisteredAttemptIsRefused(Db db) throws SQLException {
        String job = job();
        db.issue(job, 4);
        Fence fence = new Fence(Run.of(job, 4, "pod-a"));
        AttemptSupersededException e = assertThrows(AttemptSupersededException.class,
                () -> fence.inTransaction(db.connect(), tx -> null));
        assertTrue(e.getMessage().contains("is not registered"), e.getMessage());
    }

    @ParameterizedTest(name = "{0}")
    @MethodSource("engines")
    void userWithoutRightsIsNotPermitted(Db db) throws SQLException {
        String job = job();
        db.issue(job, 8);
        String[] login = db.outsider();
        Connection c = db.connectAs(login[0], login[1]);
        Fence fence = new Fence(Run.of(job, 8, "pod-a"));
        NotPermittedException e = assertThrows(NotPermittedException.class, () -> fence.register(c));
        assertEquals("SF002", e.sqlState());
        assertTrue(e.getMessage().contains(login[0] + " may not fence job " + job), e.getMessage());
        assertEquals(ExitCode.REFUSED, ExitCode.of(e));
        assertThrows(NotPermittedException.class, () -> fence.inTransaction(c, tx -> {
            insert(tx, job, "outsider");
            return null;
        }));
        assertEquals(0, db.items(job));
    }

    @ParameterizedTest(name = "{0}")
    @MethodSource("engines")
    void fenceWithoutTransactionIsMisuseAndSendsNoSql(Db db) throws SQLException {
        String job = job();
        db.issue(job, 20);
        // A stale token: had the call reached the database, the refusal counter would move.
        Fence fence = new Fence(Run.of(job, 19, "pod-a"));
        Connection c = db.connect();
        long before = db.rejections();
        MisuseException e = assertThrows(MisuseException.class, () -> fence.fence(c));
        assertTrue(e.getMessage().contains("autocommit"), e.getMessage());
        assertEquals(ExitCode.BAD_INPUT, ExitCode.of(e));
        assertEquals(before, db.rejections(), "no SQL reached the fence");
        // The counter does move when the call is made, so the check above can fail.
        c.setAutoCommit(false);
        assertThrows(StaleTokenException.class, () -> fence.fence(c));
        c.rollback();
        assertEquals(before + 1, db.rejections());
    }

    @ParameterizedTest(name = "{0}")
    @MethodSource("engines")
    void registerOrInTransactionInsideATransactionIsMisuse(Db db) throws SQLException {
        Fence fence = new Fence(Run.of(job(), 1, "pod-a")); // never issued: SQL would be refused and counted
        Connection c = db.connect();
        c.setAutoCommit(false);
        long before = db.rejections();
        assertThrows(MisuseException.class, () -> fence.register(c));
        assertThrows(MisuseException.class, () -> fence.inTransaction(c, tx -> null));
        assertEquals(before, db.rejections());
        assertFalse(c.getAutoCommit(), "the caller's connection is left as it was");
    }

    @ParameterizedTest(name = "{0}")
    @MethodSource("engines")
    void errorInTheWorkRollsBackAndIsRethrown(Db db) throws SQLException {
        String job = job();
        db.issue(job, 12);
        Fence fence = new Fence(Run.of(job, 12, "pod-a"));
        Connection c = db.connect();
        fence.register(c);

        IllegalStateException boom = new IllegalStateException("boom");
        Throwable thrown = assertThrows(IllegalStateException.class, () -> fence.inTransaction(c, tx -> {
            insert(tx, job, "rolled back");
            throw boom;
        }));
        assertSame(boom, thrown);
        assertEquals(ExitCode.RETRY, ExitCode.of(thrown));

        SQLException sql = new SQLException("the work's own database error", "57014");
        assertSame(sql, assertThrows(SQLException.class, () -> fence.inTransaction(c, tx -> {
            insert(tx, job, "rolled back too");
            throw sql;
        })));
        assertEquals(0, db.items(job));
        assertTrue(c.getAutoCommit());
    }
}
