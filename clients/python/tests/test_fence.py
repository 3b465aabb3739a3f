"""The library against real PostgreSQL (psycopg 3) and MariaDB (PyMySQL, mysqlclient)."""

from __future__ import annotations

import psycopg
import pytest

from singleton_fence import (
    AttemptSuperseded,
    ConfigError,
    FenceRefused,
    MisuseError,
    NeverIssued,
    NotPermitted,
    Run,
    StaleToken,
    exit_code,
    refusal_from,
)


def insert(job: str, note: str):
    def work(conn):
        cur = conn.cursor()
        cur.execute("INSERT INTO work (job, note) VALUES (%s, %s)", (job, note))
        cur.close()
        return note

    return work


def detectable(engine) -> None:
    if engine.name == "mysqlclient":
        pytest.skip("mysqlclient does not expose SERVER_STATUS_IN_TRANS: not detectable")


def test_registered_attempt_fences_and_commits(engine, job):
    engine.issue(job, 42)
    run = Run(job, 42, attempt="pod-a")
    conn = engine.connect()
    assert run.register(conn) == 1
    assert run.register(conn) == 1  # the same attempt registering again gets its number again

    assert run.fenced(conn, insert(job, "1 fenced")) == "1 fenced"
    with run.transaction(conn) as token:
        assert token == 42
        insert(job, "2 with")(conn)
    # Outside autocommit the fence's own statement begins the caller's transaction.
    assert run.fence(conn) == 42
    insert(job, "3 manual")(conn)
    conn.commit()

    assert engine.notes(job) == ["1 fenced", "2 with", "3 manual"]
    assert Run(job, 42, attempt="pod-b").register(engine.connect()) == 2


def test_fence_in_explicit_transaction_under_autocommit(engine, job):
    engine.issue(job, 3)
    run = Run(job, 3, attempt="a")
    conn = engine.connect(autocommit=True)
    run.register(conn)
    if engine.postgres:
        with conn.transaction():
            assert run.fence(conn) == 3
            insert(job, "x")(conn)
    else:
        conn.begin()
        assert run.fence(conn) == 3
        insert(job, "x")(conn)
        conn.commit()
    assert engine.notes(job) == ["x"]
    assert run.fenced(conn, insert(job, "y")) == "y"
    assert engine.notes(job) == ["x", "y"]


def test_stale_token(engine, job):
    engine.issue(job, 5)
    old = Run(job, 5, attempt="a")
    conn = engine.connect()
    old.register(conn)
    engine.issue(job, 6)  # a newer run's claim advanced the fence

    with pytest.raises(StaleToken) as refused:
        old.fenced(conn, insert(job, "stale"))
    assert refused.value.sqlstate == "SF001"
    assert refused.value.message == f"stale fencing token 5 for job {job}: current is 6"
    assert exit_code(refused.value) == 3
    assert engine.notes(job) == []


def test_refusal_rolls_back_the_callers_transaction_and_frees_the_fence(engine, job):
    engine.issue(job, 5)
    old = Run(job, 5, attempt="a")
    conn = engine.connect()
    old.register(conn)
    engine.issue(job, 6)

    # A write before the fence, in the caller's own transaction: on MariaDB the refusal alone
    # would leave it (and the fence row's lock) open; the library rolls it back.
    insert(job, "before")(conn)
    with pytest.raises(StaleToken):
        old.fence(conn)

    # The fence row is free at once (MariaDB would keep its lock until the rollback): the newer
    # run registers and commits without waiting, before the old run's connection does anything.
    new = Run(job, 6, attempt="b")
    other = engine.connect()
    assert new.register(other) == 1
    new.fenced(other, insert(job, "new"))

    conn.commit()  # a caller going on anyway commits nothing of the refused transaction
    assert engine.notes(job) == ["new"]


def test_retired_token(engine, job):
    engine.issue(job, 7)
    run = Run(job, 7, attempt="a")
    conn = engine.connect()
    run.register(conn)
    engine.retire(job, 7)  # the run's period was decided

    with pytest.raises(StaleToken) as refused:
        run.fenced(conn, insert(job, "late"))
    assert (
        refused.value.message == f"fencing token 7 for job {job} is retired: its period was decided"
    )
    with pytest.raises(StaleToken):
        run.register(conn)
    assert engine.notes(job) == []


def test_never_issued(engine, job):
    conn = engine.connect()
    nothing = Run(job, 1, attempt="a")  # no fence row for the job at all
    with pytest.raises(NeverIssued) as refused:
        nothing.register(conn)
    assert refused.value.sqlstate == "SF003"
    with pytest.raises(NeverIssued):
        nothing.fenced(conn, insert(job, "x"))

    engine.issue(job, 3)
    above = Run(job, 4, attempt="a")  # above the newest the controller issued
    with pytest.raises(NeverIssued) as refused:
        above.register(conn)
    assert "was never issued: the newest is 3" in refused.value.message
    with pytest.raises(NeverIssued):
        above.fenced(conn, insert(job, "x"))
    assert engine.notes(job) == []


def test_older_attempt_is_superseded(engine, job):
    engine.issue(job, 9)
    a, b = Run(job, 9, attempt="pod-a"), Run(job, 9, attempt="pod-b")
    conn_a, conn_b = engine.connect(), engine.connect()
    assert a.register(conn_a) == 1
    assert b.register(conn_b) == 2  # the replacement pod started

    with pytest.raises(AttemptSuperseded) as refused:
        a.fenced(conn_a, insert(job, "a"))
    assert refused.value.sqlstate == "SF004"
    assert "was superseded by attempt #2 (pod-b)" in refused.value.message
    with pytest.raises(AttemptSuperseded):
        a.register(conn_a)  # an older pod cannot come back
    with pytest.raises(AttemptSuperseded) as refused:
        Run(job, 9, attempt="never-registered").fenced(conn_a, insert(job, "c"))
    assert "is not registered" in refused.value.message
    assert engine.notes(job) == []

    b.fenced(conn_b, insert(job, "b"))
    assert engine.notes(job) == ["b"]


def test_not_permitted(engine, job):
    engine.issue(job, 11)
    user, password = engine.new_login()
    conn = engine.connect(user=user, password=password)
    run = Run(job, 11, attempt="a")
    with pytest.raises(NotPermitted) as refused:
        run.register(conn)
    assert refused.value.sqlstate == "SF002"
    assert f"{user} may not fence job {job}" in refused.value.message
    assert exit_code(refused.value) == 3
    with pytest.raises(NotPermitted):
        run.fenced(conn, insert(job, "x"))
    assert engine.notes(job) == []


def test_fence_without_transaction_is_misuse_and_sends_no_sql(engine, job):
    detectable(engine)
    engine.issue(job, 5)
    run = Run(job, 5, attempt="a")
    conn = engine.connect(autocommit=True)
    run.register(conn)
    engine.issue(job, 6)  # so that any fence SQL reaching the server would be refused and counted

    before = engine.rejections()
    with pytest.raises(MisuseError) as misuse:
        run.fence(conn)
    assert exit_code(misuse.value) == 2
    assert engine.rejections() == before
    # The counter does see a fence that reaches the server.
    with pytest.raises(StaleToken):
        run.fenced(conn, insert(job, "x"))
    assert engine.rejections() == before + 1


def test_register_or_fenced_with_a_transaction_open_is_misuse(engine, job):
    detectable(engine)
    engine.issue(job, 5)
    run = Run(job, 5, attempt="a")
    conn = engine.connect()
    insert(job, "uncommitted")(conn)  # the caller's transaction, still open
    with pytest.raises(MisuseError):
        run.register(conn)  # would commit the caller's write
    with pytest.raises(MisuseError):
        run.fenced(conn, insert(job, "x"))
    conn.rollback()
    assert engine.notes(job) == []
    assert run.register(conn) == 1

    if not engine.postgres:  # begun explicitly under autocommit: the server status says so
        conn = engine.connect(autocommit=True)
        conn.begin()
        with pytest.raises(MisuseError):
            run.register(conn)


def test_error_in_the_callback_rolls_back_and_propagates(engine, job):
    engine.issue(job, 5)
    run = Run(job, 5, attempt="a")
    conn = engine.connect()
    run.register(conn)

    def fail(c):
        insert(job, "half")(c)
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        run.fenced(conn, fail)
    with pytest.raises(ValueError, match="boom"):
        with run.transaction(conn):
            fail(conn)
    assert engine.notes(job) == []
    run.fenced(conn, insert(job, "after"))  # the connection is usable again
    assert engine.notes(job) == ["after"]


def test_attempt_is_required_before_any_sql(engine, job):
    engine.issue(job, 5)
    conn = engine.connect()
    for call in (Run(job, 5).register, Run(job, 5).fence, lambda c: Run(job, 5).fenced(c, print)):
        with pytest.raises(ConfigError) as config:
            call(conn)
        assert config.value.variable == "SINGLETON_ATTEMPT"


def test_other_table_prefix(engine, job):
    conn = engine.connect()
    with pytest.raises(Exception) as failed:  # the driver's own error: no such function
        Run(job, 5, attempt="a", table_prefix="other_").register(conn)
    assert not isinstance(failed.value, FenceRefused)
    assert exit_code(failed.value) == 1


def test_driver_errors_map_to_refusals(engine, job):
    engine.issue(job, 5)
    conn = engine.connect()
    cur = conn.cursor()
    with pytest.raises(Exception) as raw:
        cur.execute("SELECT singleton_fence(%s, %s, %s)", (job, 4, "a"))
    conn.rollback()
    assert type(raw.value).__module__.split(".")[0] in ("psycopg", "pymysql", "MySQLdb")
    assert isinstance(refusal_from(raw.value), StaleToken)
    assert exit_code(raw.value) == 3
    if not engine.postgres:
        # PyMySQL before 1.2 and mysqlclient give no SQLSTATE: the MYSQL_ERRNO tells.
        assert raw.value.args[0] == 31001
        raw.value.sqlstate = None
        assert isinstance(refusal_from(raw.value), StaleToken)


@pytest.mark.parametrize("engine", ["postgres"], indirect=True)
def test_postgres_failed_transaction(engine, job):
    engine.issue(job, 5)
    run = Run(job, 5, attempt="a")
    conn = engine.connect()
    run.register(conn)

    with pytest.raises(psycopg.errors.DivisionByZero):
        conn.execute("SELECT 1/0")
    with pytest.raises(MisuseError, match="already failed"):
        run.fence(conn)  # PostgreSQL would only answer 25P02
    conn.rollback()

    def swallow(c):
        insert(job, "lost")(c)
        try:
            c.execute("SELECT 1/0")
        except Exception:
            pass  # psycopg would then commit silently as a rollback

    with pytest.raises(MisuseError, match="nothing was committed"):
        run.fenced(conn, swallow)
    assert engine.notes(job) == []


def test_unsupported_connection():
    with pytest.raises(MisuseError, match="unsupported connection") as misuse:
        Run("a/b", 1, attempt="a").register(object())
    assert exit_code(misuse.value) == 2
