"""Real databases: a fresh database per engine per test session, with the controller's schema
(clients/testdata), dropped at the end. DATABASE_URL (PostgreSQL) and MARIADB_URL must be set."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import psycopg
import psycopg.conninfo
import pymysql
import pytest

try:  # optional: mysqlclient needs a C build against the MariaDB/MySQL client headers
    import MySQLdb
except ImportError:  # pragma: no cover - depends on the machine
    MySQLdb = None

TESTDATA = Path(__file__).resolve().parents[2] / "testdata"
WORK_TABLE = "CREATE TABLE work (job VARCHAR(512) NOT NULL, note VARCHAR(100) NOT NULL)"


def _url(name: str, how: str) -> str:
    url = os.environ.get(name)
    if not url:
        pytest.fail(f"{name} is not set: {how}", pytrace=False)
    return url


def _suffix() -> str:
    return uuid.uuid4().hex[:12]


@pytest.fixture(scope="session")
def pg_db():
    """(admin url, test database conninfo)"""
    url = _url("DATABASE_URL", "the PostgreSQL URL, e.g. `hack/postgres.sh url`")
    name = f"python_{_suffix()}"
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    dsn = psycopg.conninfo.make_conninfo(url, dbname=name)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            # One simple query: without parameters psycopg sends the whole script as is.
            conn.execute((TESTDATA / "postgres.sql").read_text())
            conn.execute(WORK_TABLE)
        yield dsn
    finally:
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def mysql_params(url: str) -> dict:
    u = urlsplit(url)
    query = parse_qs(u.query)
    return {
        "host": u.hostname or "127.0.0.1",
        "port": u.port or 3306,
        "user": unquote(u.username or ""),
        "password": unquote(u.password or ""),
        "database": u.path.lstrip("/") or None,
        "ssl_disabled": query.get("ssl-mode", [""])[0].upper() == "DISABLED",
    }


def pymysql_connect(params: dict, **over):
    p = {**params, **over}
    return pymysql.connect(
        host=p["host"],
        port=p["port"],
        user=p["user"],
        password=p["password"],
        database=p["database"],
        ssl_disabled=p["ssl_disabled"],
        autocommit=p.get("autocommit", False),
        init_command="SET SESSION innodb_lock_wait_timeout = 3",
    )


def mysqlclient_connect(params: dict, **over):
    p = {**params, **over}
    extra = {"ssl_mode": "DISABLED"} if p["ssl_disabled"] else {}
    return MySQLdb.connect(
        host=p["host"],
        port=p["port"],
        user=p["user"],
        password=p["password"],
        database=p["database"],
        autocommit=p.get("autocommit", False),
        init_command="SET SESSION innodb_lock_wait_timeout = 3",
        **extra,
    )


def mariadb_statements(script: str) -> list:
    lines = [
        line
        for line in script.splitlines()
        if not line.startswith("--") and not line.startswith("DELIMITER")
    ]
    return [s.strip() for s in ("\n".join(lines) + "\n").split("\n//\n") if s.strip()]


@pytest.fixture(scope="session")
def maria_db():
    """connection parameters of the test database"""
    params = mysql_params(_url("MARIADB_URL", "the MariaDB URL, e.g. `hack/mariadb.sh url`"))
    name = f"python_{_suffix()}"
    with pymysql_connect(params, autocommit=True) as admin, admin.cursor() as cur:
        cur.execute(f"CREATE DATABASE {name}")
    test = {**params, "database": name}
    try:
        with pymysql_connect(test, autocommit=True) as conn, conn.cursor() as cur:
            for statement in mariadb_statements((TESTDATA / "mariadb.sql").read_text()):
                cur.execute(statement)
            cur.execute(WORK_TABLE + " ENGINE=InnoDB")
        yield test
    finally:
        with pymysql_connect(params, autocommit=True) as admin, admin.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {name}")


class Engine:
    """One driver against its database: connections to test with, and the controller's side
    (issuing and retiring tokens) done in SQL by an admin connection in autocommit."""

    def __init__(self, name: str, db, admin):
        self.name = name
        self.db = db
        self.admin = admin
        self.postgres = name == "postgres"
        self._cleanup = []

    def connect(self, autocommit: bool = False, user: str = None, password: str = None):
        # A short lock wait: a fence row left locked by mistake fails the test instead of hanging.
        login = {"user": user, "password": password} if user else {}
        if self.postgres:
            conn = psycopg.connect(
                self.db, autocommit=autocommit, options="-c lock_timeout=3s", **login
            )
        else:
            make = pymysql_connect if self.name == "pymysql" else mysqlclient_connect
            conn = make(self.db, autocommit=autocommit, **login)
        self._cleanup.append(conn.close)
        return conn

    def sql(self, query: str, *args):
        cur = self.admin.cursor()
        try:
            cur.execute(query, args or None)
            return cur.fetchall() if cur.description else []
        finally:
            cur.close()

    def issue(self, job: str, token: int) -> None:
        if self.postgres:
            self.sql(
                "INSERT INTO singleton_fences (job, token) VALUES (%s, %s)"
                " ON CONFLICT (job) DO UPDATE SET token = EXCLUDED.token",
                job,
                token,
            )
        else:
            self.sql(
                "INSERT INTO singleton_fences (job, token, owner)"
                " VALUES (%s, %s, SUBSTRING_INDEX(SESSION_USER(), '@', 1))"
                " ON DUPLICATE KEY UPDATE token = VALUES(token)",
                job,
                token,
            )

    def retire(self, job: str, token: int) -> None:
        self.sql("UPDATE singleton_fences SET retired = %s WHERE job = %s", token, job)

    def notes(self, job: str) -> list:
        """What committed in the work table for the job."""
        return [r[0] for r in self.sql("SELECT note FROM work WHERE job = %s ORDER BY note", job)]

    def rejections(self) -> int:
        """The fence's refusal counter: it moves whenever refused fence SQL reaches the server."""
        if self.postgres:
            rows = self.sql(
                "SELECT CASE WHEN is_called THEN last_value ELSE 0 END"
                " FROM singleton_fence_rejections"
            )
        else:
            rows = self.sql("SELECT n FROM singleton_fence_rejections WHERE id = 1")
        return int(rows[0][0])

    def new_login(self) -> tuple:
        """A database user/role that may run the functions but owns no job."""
        user, password = f"py_{_suffix()}", "x"
        if self.postgres:
            self.sql(f"CREATE ROLE {user} LOGIN PASSWORD '{password}'")
            self.sql(
                f"GRANT EXECUTE ON FUNCTION singleton_attempt(text, bigint, text),"
                f" singleton_fence(text, bigint, text) TO {user}"
            )
            self._cleanup.append(lambda: self.sql(f"DROP ROLE {user}"))
            self._cleanup.append(lambda: self.sql(f"DROP OWNED BY {user}"))
        else:
            self.sql(f"CREATE USER '{user}'@'%' IDENTIFIED BY '{password}'")
            self.sql(f"GRANT EXECUTE, SELECT, INSERT ON `{self.db['database']}`.* TO '{user}'@'%'")
            self._cleanup.append(lambda: self.sql(f"DROP USER '{user}'@'%'"))
        return user, password

    def close(self) -> None:
        for step in reversed(self._cleanup):  # connections first, then what they used
            step()


@pytest.fixture(scope="session")
def pg_admin(pg_db):
    with psycopg.connect(pg_db, autocommit=True) as conn:
        yield conn


@pytest.fixture(scope="session")
def maria_admin(maria_db):
    with pymysql_connect(maria_db, autocommit=True) as conn:
        yield conn


ENGINES = [
    "postgres",
    "pymysql",
    pytest.param(
        "mysqlclient",
        marks=pytest.mark.skipif(
            MySQLdb is None,
            reason="mysqlclient not installed (it needs the MariaDB/MySQL C headers)",
        ),
    ),
]


@pytest.fixture(params=ENGINES)
def engine(request):
    if request.param == "postgres":
        e = Engine(
            "postgres", request.getfixturevalue("pg_db"), request.getfixturevalue("pg_admin")
        )
    else:
        e = Engine(
            request.param,
            request.getfixturevalue("maria_db"),
            request.getfixturevalue("maria_admin"),
        )
    yield e
    e.close()


@pytest.fixture
def job() -> str:
    return f"tests/{_suffix()}"
