"""The database side through a DB-API connection: psycopg 3 (PostgreSQL), PyMySQL or mysqlclient
(MariaDB/MySQL). The driver is told by the connection's module, so no driver is imported here."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any

from ._errors import ConfigError, MisuseError, refusal_from

if TYPE_CHECKING:
    from ._run import Run

PSYCOPG, PYMYSQL, MYSQLDB = "psycopg", "pymysql", "MySQLdb"
# The MySQL protocol's SERVER_STATUS_IN_TRANS bit.
_IN_TRANS = 0x0001


def driver(conn: Any) -> str:
    """Which driver made ``conn``: the top-level module of its class (or a base class)."""
    for cls in type(conn).__mro__:
        root = cls.__module__.split(".")[0]
        if root == PSYCOPG:
            if any(c.__name__.startswith("Async") for c in type(conn).__mro__):
                raise MisuseError(
                    "psycopg's AsyncConnection is not supported: use psycopg.Connection"
                )
            return PSYCOPG
        if root in (PYMYSQL, MYSQLDB):
            return root
    raise MisuseError(
        f"unsupported connection {type(conn).__module__}.{type(conn).__qualname__}: "
        "pass a psycopg 3, PyMySQL or mysqlclient (MySQLdb) connection"
    )


def _status(conn: Any, drv: str) -> str | None:
    """'idle', 'open', 'failed' or 'busy'; None where the driver does not tell."""
    if drv == PSYCOPG:
        name = conn.info.transaction_status.name
        return {"IDLE": "idle", "INTRANS": "open", "INERROR": "failed", "ACTIVE": "busy"}.get(name)
    if drv == PYMYSQL:
        # Only OK packets update server_status (PyMySQL ignores the status of a result set's
        # EOF), but BEGIN, COMMIT, ROLLBACK and every INSERT/UPDATE/DELETE answer with one: a
        # transaction begun explicitly or holding writes always shows.
        return "open" if (conn.server_status or 0) & _IN_TRANS else "idle"
    return None  # mysqlclient exposes the autocommit bit only


def _autocommit(conn: Any, drv: str) -> bool:
    if drv == PSYCOPG:
        return bool(conn.autocommit)
    return bool(conn.get_autocommit())  # both MySQL drivers: the server's SERVER_STATUS_AUTOCOMMIT


def _attempt(run: Run) -> str:
    if run.attempt is None:
        raise ConfigError("SINGLETON_ATTEMPT", "SINGLETON_ATTEMPT is not set: fencing needs it")
    return run.attempt


def _require_no_transaction(conn: Any, drv: str, what: str) -> None:
    if _status(conn, drv) in ("open", "failed", "busy"):
        raise MisuseError(
            f"{what} needs a transaction of its own, but one is open on this connection: "
            "commit or roll back first"
        )


def _require_transaction(conn: Any, drv: str) -> None:
    status = _status(conn, drv)
    if status == "failed":
        raise MisuseError("the transaction already failed: roll it back and begin a new one")
    if status == "busy":
        raise MisuseError("the connection is busy with another statement")
    # Outside autocommit the fence's statement begins the transaction, as any DB-API statement.
    if status == "idle" and _autocommit(conn, drv):
        raise MisuseError(
            "no transaction open (autocommit): the fence would end with its own statement; "
            "begin one first (psycopg: conn.transaction(), PyMySQL: conn.begin()) "
            "or use run.transaction()/run.fenced()"
        )


def _call(conn: Any, sql: str, args: Sequence[Any]) -> int:
    cur = conn.cursor()
    try:
        cur.execute(sql, args)
        row = cur.fetchone()
    finally:
        cur.close()
    return int(row[0])


def _rollback_quietly(conn: Any) -> None:
    # Best effort: the original error matters more than a failed rollback on a broken connection.
    with suppress(Exception):
        conn.rollback()


def _raise_refusal(exc: BaseException) -> None:
    refusal = refusal_from(exc)
    if refusal is not None:
        raise refusal from exc


def register(run: Run, conn: Any) -> int:
    attempt = _attempt(run)
    drv = driver(conn)
    _require_no_transaction(conn, drv, "register")
    autocommit = _autocommit(conn, drv)
    try:
        number = _call(
            conn, f"SELECT {run.table_prefix}attempt(%s, %s, %s)", (run.job, run.token, attempt)
        )
        if not autocommit:
            conn.commit()
        return number
    except Exception as exc:
        if not autocommit:
            _rollback_quietly(conn)
        _raise_refusal(exc)
        raise


def fence(run: Run, conn: Any, *, rollback: bool = True) -> int:
    attempt = _attempt(run)
    drv = driver(conn)
    _require_transaction(conn, drv)
    try:
        return _call(
            conn, f"SELECT {run.table_prefix}fence(%s, %s, %s)", (run.job, run.token, attempt)
        )
    except Exception as exc:
        # MariaDB keeps the transaction, its writes and the fence row's lock after a refusal
        # (PostgreSQL aborts it): end it now, so nothing in it can commit and the row is free.
        # Inside psycopg's conn.transaction() block this raises and the block rolls back instead.
        if rollback:
            _rollback_quietly(conn)
        _raise_refusal(exc)
        raise


@contextmanager
def transaction(run: Run, conn: Any) -> Iterator[int]:
    _attempt(run)
    drv = driver(conn)
    _require_no_transaction(conn, drv, "a fenced transaction")
    if drv == PSYCOPG:
        with conn.transaction():
            yield fence(run, conn, rollback=False)
            # psycopg commits an aborted transaction silently as a rollback: say so instead.
            if conn.info.transaction_status.name == "INERROR":
                raise MisuseError(
                    "an error inside the fenced transaction was caught and not re-raised; "
                    "PostgreSQL aborted the transaction and nothing was committed"
                )
        return
    conn.begin()
    try:
        yield fence(run, conn, rollback=False)
        conn.commit()
    except BaseException:
        _rollback_quietly(conn)
        raise
