package dev.singleton.fence;

import java.io.IOException;
import java.net.URI;
import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.SecureRandom;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.Properties;

/**
 * A fresh database of one engine for one test run: created from the admin URL in the environment,
 * loaded with the controller's schema from clients/testdata, dropped by {@link #drop()}. Not
 * AutoCloseable: JUnit would close a parameter after each test. Its
 * fixtures do in SQL what the controller does (issue and retire tokens).
 */
abstract class Db {
    final String name = "java_" + random();
    final String host;
    final int port;
    final String adminDb;
    final String user;
    final String password;
    /** The test's own admin connection to the fresh database, in autocommit mode. */
    Connection admin;
    private final List<Connection> opened = new ArrayList<>();

    private Db(String variable, String example) {
        String url = System.getenv(variable);
        if (url == null || url.isEmpty()) {
            throw new IllegalStateException(variable + " is not set: the tests need a real server, e.g. " + variable
                    + "=" + example + " (clients/java/test.sh sets it from hack/*.sh url)");
        }
        URI u = URI.create(url);
        host = u.getHost();
        port = u.getPort();
        adminDb = u.getPath().replaceFirst("^/", "");
        String info = u.getRawUserInfo() == null ? "" : u.getRawUserInfo();
        int colon = info.indexOf(':');
        user = decode(colon < 0 ? info : info.substring(0, colon));
        password = colon < 0 ? "" : decode(info.substring(colon + 1));
    }

    static Db postgres() throws SQLException, IOException {
        Db db = new Postgres();
        db.setUp();
        return db;
    }

    static Db mariadb() throws SQLException, IOException {
        Db db = new MariaDb();
        db.setUp();
        return db;
    }

    abstract Fence.Engine engine();

    abstract String jdbcUrl(String database);

    abstract void load(Connection c) throws SQLException, IOException;

    abstract void issue(String job, long token) throws SQLException;

    abstract long rejections() throws SQLException;

    /** A login without any right to the jobs (but EXECUTE on the functions): [user, password]. */
    abstract String[] outsider() throws SQLException;

    abstract void dropRoles() throws SQLException;

    void setUp() throws SQLException, IOException {
        try (Connection c = open(adminDb, user, password); Statement s = c.createStatement()) {
            s.execute("CREATE DATABASE " + name);
        }
        admin = connect();
        load(admin);
    }

    Connection connect() throws SQLException {
        return connectAs(user, password);
    }

    Connection connectAs(String user, String password) throws SQLException {
        Connection c = open(name, user, password);
        opened.add(c);
        return c;
    }

    Connection open(String database, String user, String password) throws SQLException {
        Properties p = new Properties();
        p.setProperty("user", user);
        p.setProperty("password", password);
        return DriverManager.getConnection(jdbcUrl(database), p);
    }

    void retire(String job, long token) throws SQLException {
        update("UPDATE singleton_fences SET retired = ? WHERE job = ?", token, job);
    }

    void update(String sql, Object... args) throws SQLException {
        try (PreparedStatement ps = admin.prepareStatement(sql)) {
            for (int i = 0; i < args.length; i++) {
                ps.setObject(i + 1, args[i]);
            }
            ps.executeUpdate();
        }
    }

    long count(String sql, Object... args) throws SQLException {
        try (PreparedStatement ps = admin.prepareStatement(sql)) {
            for (int i = 0; i < args.length; i++) {
                ps.setObject(i + 1, args[i]);
            }
            try (ResultSet rs = ps.executeQuery()) {
                rs.next();
                return rs.getLong(1);
            }
        }
    }

    /** Rows the tests' callbacks wrote for a job, as another session sees them (committed only). */
    long items(String job) throws SQLException {
        return count("SELECT count(*) FROM items WHERE job = ?", job);
    }

    void drop() throws SQLException {
        for (Connection c : opened) {
            try {
                c.close();
            } catch (SQLException ignored) {
                // dropping the database is what matters
            }
        }
        try (Connection c = open(adminDb, user, password); Statement s = c.createStatement()) {
            s.execute(dropDatabase());
        }
        dropRoles();
    }

    abstract String dropDatabase();

    @Override
    public String toString() {
        return engine().name().toLowerCase();
    }

    static Path testdata(String file) {
        String base = System.getProperty("basedir", System.getProperty("user.dir"));
        return Path.of(base, "..", "testdata", file).normalize();
    }

    private static String random() {
        byte[] b = new byte[5];
        new SecureRandom().nextBytes(b);
        return HexFormat.of().formatHex(b);
    }

    private static String decode(String s) {
        return URLDecoder.decode(s, StandardCharsets.UTF_8);
    }

    static final class Postgres extends Db {
        private final List<String> roles = new ArrayList<>();

        Postgres() {
            super("DATABASE_URL", "postgres://postgres@127.0.0.1:25432/singleton?sslmode=disable");
        }

        @Override
        Fence.Engine engine() {
            return Fence.Engine.POSTGRESQL;
        }

        @Override
        String jdbcUrl(String database) {
            return "jdbc:postgresql://" + host + ":" + (port < 0 ? 5432 : port) + "/" + database + "?sslmode=disable";
        }

        @Override
        void load(Connection c) throws SQLException, IOException {
            // The script is one multi-statement text: send it as one simple query, as psql -c would.
            Properties p = new Properties();
            p.setProperty("user", user);
            p.setProperty("password", password);
            p.setProperty("preferQueryMode", "simple");
            try (Connection simple = DriverManager.getConnection(jdbcUrl(name), p);
                 Statement s = simple.createStatement()) {
                s.execute(Files.readString(testdata("postgres.sql")));
                s.execute("CREATE TABLE items (job text NOT NULL, note text)");
            }
        }

        @Override
        void issue(String job, long token) throws SQLException {
            update("INSERT INTO singleton_fences (job, token) VALUES (?, ?) "
                    + "ON CONFLICT (job) DO UPDATE SET token = EXCLUDED.token", job, token);
        }

        @Override
        long rejections() throws SQLException {
            return count("SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM singleton_fence_rejections");
        }

        @Override
        String[] outsider() throws SQLException {
            String role = name + "_outsider";
            try (Statement s = admin.createStatement()) {
                s.execute("CREATE ROLE " + role + " LOGIN PASSWORD 'x'");
                roles.add(role);
                s.execute("GRANT EXECUTE ON FUNCTION singleton_fence(text, bigint, text), "
                        + "singleton_attempt(text, bigint, text) TO " + role);
            }
            return new String[] {role, "x"};
        }

        @Override
        String dropDatabase() {
            return "DROP DATABASE IF EXISTS " + name + " WITH (FORCE)";
        }

        @Override
        void dropRoles() throws SQLException {
            if (roles.isEmpty()) {
                return;
            }
            // After the database is gone, nothing in it refers to the roles any more.
            try (Connection c = open(adminDb, user, password); Statement s = c.createStatement()) {
                for (String r : roles) {
                    s.execute("DROP ROLE IF EXISTS " + r);
                }
            }
        }
    }

    static final class MariaDb extends Db {
        private final List<String> users = new ArrayList<>();

        MariaDb() {
            super("MARIADB_URL", "mysql://singleton:singleton@127.0.0.1:23306/singleton?ssl-mode=DISABLED");
        }

        @Override
        Fence.Engine engine() {
            return Fence.Engine.MARIADB;
        }

        @Override
        String jdbcUrl(String database) {
            return "jdbc:mariadb://" + host + ":" + (port < 0 ? 3306 : port) + "/" + database + "?sslMode=disable";
        }

        @Override
        void load(Connection c) throws SQLException, IOException {
            // Comment and DELIMITER lines out, then one statement per '//' line.
            StringBuilder text = new StringBuilder();
            for (String line : Files.readAllLines(testdata("mariadb.sql"))) {
                if (!line.startsWith("--") && !line.startsWith("DELIMITER")) {
                    text.append(line).append('\n');
                }
            }
            try (Statement s = c.createStatement()) {
                for (String stmt : ("\n" + text).split("\n//\n")) {
                    if (!stmt.isBlank()) {
                        s.execute(stmt);
                    }
                }
                s.execute("CREATE TABLE items (job VARCHAR(200) NOT NULL, note VARCHAR(200)) ENGINE=InnoDB");
            }
        }

        @Override
        void issue(String job, long token) throws SQLException {
            update("INSERT INTO singleton_fences (job, token, owner) "
                    + "VALUES (?, ?, SUBSTRING_INDEX(SESSION_USER(), '@', 1)) "
                    + "ON DUPLICATE KEY UPDATE token = VALUES(token)", job, token);
        }

        @Override
        long rejections() throws SQLException {
            return count("SELECT n FROM singleton_fence_rejections WHERE id = 1");
        }

        @Override
        String[] outsider() throws SQLException {
            String u = name + "_outsider";
            try (Statement s = admin.createStatement()) {
                s.execute("CREATE USER '" + u + "'@'%' IDENTIFIED BY 'x'");
                users.add(u);
                s.execute("GRANT EXECUTE, SELECT, INSERT ON " + name + ".* TO '" + u + "'@'%'");
            }
            return new String[] {u, "x"};
        }

        @Override
        String dropDatabase() {
            return "DROP DATABASE IF EXISTS " + name;
        }

        @Override
        void dropRoles() throws SQLException {
            if (users.isEmpty()) {
                return;
            }
            try (Connection c = open(adminDb, user, password); Statement s = c.createStatement()) {
                for (String u : users) {
                    s.execute("DROP USER IF EXISTS '" + u + "'@'%'");
                }
            }
        }
    }
}
