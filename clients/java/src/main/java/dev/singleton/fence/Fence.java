package dev.singleton.fence;

import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.util.Locale;
import java.util.Objects;
import java.util.regex.Pattern;

/**
 * Fencing for one run: {@link #register} once when the process starts, then {@link #fence} first
 * in every transaction that writes (or {@link #inTransaction}, which does both ends for you).
 * Works with any JDBC connection to PostgreSQL or MariaDB/MySQL, including one that a framework's
 * transaction manager opened (Spring: {@code DataSourceUtils.getConnection(dataSource)} inside
 * {@code @Transactional}). Immutable and thread-safe; connections are the caller's to manage.
 */
public final class Fence {
    /** The controller's default table prefix. */
    public static final String DEFAULT_TABLE_PREFIX = "singleton_";

    // The prefix is pasted into SQL as an identifier, so only this shape is accepted.
    private static final Pattern PREFIX = Pattern.compile("[a-z][a-z0-9_]{0,31}");

    private final Run run;
    private final String tablePrefix;
    private final String attemptSql;
    private final String fenceSql;

    /** Fencing for {@code run} with the default table prefix {@code singleton_}. */
    public Fence(Run run) {
        this(run, DEFAULT_TABLE_PREFIX);
    }

    /**
     * Fencing for {@code run} with the table prefix the controller was configured with.
     *
     * @throws ConfigException when the prefix is not 1 to 32 of {@code a-z 0-9 _}, starting with a letter
     */
    public Fence(Run run, String tablePrefix) {
        this.run = Objects.requireNonNull(run, "run");
        if (tablePrefix == null || !PREFIX.matcher(tablePrefix).matches()) {
            throw new ConfigException("table prefix must be 1 to 32 lower-case letters, digits or '_', "
                    + "starting with a letter, got \"" + tablePrefix + "\"");
        }
        this.tablePrefix = tablePrefix;
        this.attemptSql = "SELECT " + tablePrefix + "attempt(?, ?, ?)";
        this.fenceSql = "SELECT " + tablePrefix + "fence(?, ?, ?)";
    }

    /** Fencing for the run described by the environment, default table prefix. */
    public static Fence fromEnv() {
        return new Fence(Run.fromEnv());
    }

    public Run run() {
        return run;
    }

    public String tablePrefix() {
        return tablePrefix;
    }

    /**
     * Registers this process as the run's newest attempt: call once when it starts, before its
     * work. From then on no older attempt of the run commits a fenced write. Registering again
     * returns the same number.
     *
     * @param connection a connection in autocommit mode: the registration must commit on its own
     * @return the attempt's number in its run: 1 for the first pod, then 2, ...
     * @throws MisuseException       when the connection has autocommit off (no SQL is sent)
     * @throws FenceRefusedException when the database refuses the run (exit code 3)
     * @throws SQLException          any other database error
     */
    public int register(Connection connection) throws SQLException {
        Engine.of(connection);
        // With autocommit off JDBC cannot tell an idle connection from one inside a transaction,
        // and registering inside the caller's transaction would hold the fence row's lock until
        // that commits, or be rolled back with it.
        if (!connection.getAutoCommit()) {
            throw new MisuseException("register() commits on its own: give it a connection in autocommit mode, "
                    + "not one inside a transaction (this one has autocommit off)");
        }
        return Math.toIntExact(call(connection, attemptSql));
    }

    /**
     * Fences the caller's open transaction: call it first, before the transaction's writes. It
     * holds the job's fence row until the transaction ends, so a newer run waits for the commit
     * and this run's writes commit only while it is current.
     *
     * <p>On a refusal the caller must not go on: roll back and stop (exit code 3). PostgreSQL has
     * already aborted the transaction; MariaDB/MySQL keep it open, so a commit there would
     * commit whatever the transaction wrote before this call. A {@code @Transactional} method
     * rolls back by itself, since the refusal is a {@link RuntimeException}.
     *
     * @param connection a connection inside a transaction (autocommit off), e.g. Spring's
     *                   {@code DataSourceUtils.getConnection(dataSource)} within {@code @Transactional}
     * @return the fencing token
     * @throws MisuseException       when the connection is in autocommit mode (no SQL is sent)
     * @throws FenceRefusedException when the database refuses the run
     * @throws SQLException          any other database error
     */
    public long fence(Connection connection) throws SQLException {
        Engine.of(connection);
        // In autocommit mode the call would be a transaction of its own: the lock would be gone
        // before the caller's writes, which would then not be fenced at all.
        if (connection.getAutoCommit()) {
            throw new MisuseException("fence() must run inside a transaction, as its first statement: this connection "
                    + "is in autocommit mode (call setAutoCommit(false) first, use inTransaction(), or in Spring "
                    + "use DataSourceUtils.getConnection(dataSource) inside @Transactional)");
        }
        return call(connection, fenceSql);
    }

    /** The caller's work inside a fenced transaction. */
    @FunctionalInterface
    public interface Work<T> {
        T run(Connection connection) throws SQLException;
    }

    /**
     * Opens a transaction on {@code connection}, fences it, runs {@code work}, and commits. On any
     * error (a refusal included) it rolls back and rethrows. The connection is back in autocommit
     * mode afterwards.
     *
     * @param connection a connection in autocommit mode (the transaction is this method's own)
     * @return what {@code work} returned
     * @throws MisuseException       when the connection has autocommit off: a transaction may be
     *                               open already, and the fence must come first in it
     * @throws FenceRefusedException when the database refuses the run (nothing was committed)
     */
    public <T> T inTransaction(Connection connection, Work<T> work) throws SQLException {
        Objects.requireNonNull(work, "work");
        Engine.of(connection);
        if (!connection.getAutoCommit()) {
            throw new MisuseException("inTransaction() opens the transaction itself: give it a connection in "
                    + "autocommit mode, or call fence() first inside the transaction you opened");
        }
        connection.setAutoCommit(false);
        T result;
        try {
            fence(connection);
            result = work.run(connection);
            connection.commit();
        } catch (Throwable t) {
            // MariaDB/MySQL keep the transaction open after a refusal: it must not be left to a
            // later commit (or a pool that commits on return).
            try {
                connection.rollback();
            } catch (SQLException | RuntimeException e) {
                t.addSuppressed(e);
            }
            try {
                connection.setAutoCommit(true);
            } catch (SQLException | RuntimeException e) {
                t.addSuppressed(e);
            }
            throw t;
        }
        connection.setAutoCommit(true);
        return result;
    }

    // One row, one column; a refusal becomes its FenceRefusedException.
    private long call(Connection connection, String sql) throws SQLException {
        try (PreparedStatement ps = connection.prepareStatement(sql)) {
            ps.setString(1, run.job());
            ps.setLong(2, run.token());
            ps.setString(3, run.attempt());
            try (ResultSet rs = ps.executeQuery()) {
                if (!rs.next()) {
                    throw new SQLException(sql + " returned no row");
                }
                return rs.getLong(1);
            }
        } catch (SQLException e) {
            FenceRefusedException refused = FenceRefusedException.from(e);
            if (refused != null) {
                throw refused;
            }
            throw e;
        }
    }

    /** The engines the functions exist for; told apart by the driver's metadata (no SQL sent). */
    enum Engine {
        POSTGRESQL,
        MARIADB;

        static Engine of(Connection connection) throws SQLException {
            Objects.requireNonNull(connection, "connection");
            String product = connection.getMetaData().getDatabaseProductName();
            String p = product == null ? "" : product.toLowerCase(Locale.ROOT);
            if (p.contains("postgres")) {
                return POSTGRESQL;
            }
            if (p.contains("mariadb") || p.contains("mysql")) {
                return MARIADB;
            }
            throw new MisuseException("singleton fencing supports PostgreSQL and MariaDB/MySQL, not " + product);
        }
    }
}
