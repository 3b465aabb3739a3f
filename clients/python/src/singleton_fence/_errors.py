"""The errors of singleton_fence and the exit-code convention of the chart's podFailurePolicy."""

from __future__ import annotations


class SingletonError(Exception):
    """Base of every error this library raises; ``exit_code`` is the process exit code it means."""

    exit_code = 1


class ConfigError(SingletonError, ValueError):
    """A SINGLETON_* variable (or an explicit Run argument, or an option) is missing or invalid."""

    exit_code = 2

    def __init__(self, variable: str | None, message: str) -> None:
        super().__init__(message)
        self.variable = variable


class MisuseError(SingletonError):
    """The library was called the wrong way (no transaction open, one already open, unknown driver).

    Raised before any SQL is sent for the fence, so nothing happened in the database.
    """

    exit_code = 2


class FenceRefused(SingletonError):
    """The database refused this run: it must stop without committing and not retry (exit 3).

    ``sqlstate`` is SF001..SF004; ``message`` the database's message.
    """

    exit_code = 3
    code = ""

    def __init__(self, sqlstate: str, message: str) -> None:
        super().__init__(f"{message} (SQLSTATE {sqlstate})")
        self.sqlstate = sqlstate
        self.message = message


class StaleToken(FenceRefused):
    """SF001: a newer run holds the fence, or this token's period was decided (retired)."""

    code = "SF001"


class NotPermitted(FenceRefused):
    """SF002: the database user/role may not fence this job."""

    code = "SF002"


class NeverIssued(FenceRefused):
    """SF003: the controller never issued this token for this job."""

    code = "SF003"


class AttemptSuperseded(FenceRefused):
    """SF004: a newer attempt (pod) of this run registered, or this attempt never registered."""

    code = "SF004"


_BY_SQLSTATE = {c.code: c for c in (StaleToken, NotPermitted, NeverIssued, AttemptSuperseded)}
# MariaDB/MySQL raise the same refusals with these MYSQL_ERRNOs, for drivers that drop the
# SQLSTATE (PyMySQL before 1.2, mysqlclient).
_BY_ERRNO = {31001: "SF001", 31002: "SF002", 31003: "SF003", 31004: "SF004"}
_MYSQL_DRIVERS = ("pymysql", "MySQLdb")


def refusal_from(exc: BaseException) -> FenceRefused | None:
    """The fence refusal a driver's exception carries, or None when it is not one.

    Useful when calling ``singleton_fence``/``singleton_attempt`` through other means (an ORM).
    """
    if isinstance(exc, FenceRefused):
        return exc
    sqlstate = getattr(exc, "sqlstate", None)
    args = getattr(exc, "args", ())
    if sqlstate not in _BY_SQLSTATE and type(exc).__module__.split(".")[0] in _MYSQL_DRIVERS:
        if args and isinstance(args[0], int):
            sqlstate = _BY_ERRNO.get(args[0], sqlstate)
    cls = _BY_SQLSTATE.get(sqlstate) if isinstance(sqlstate, str) else None
    if cls is None:
        return None
    return cls(sqlstate, _message(exc))


def _message(exc: BaseException) -> str:
    diag = getattr(exc, "diag", None)  # psycopg: the primary message, without HINT/CONTEXT lines
    primary = getattr(diag, "message_primary", None)
    if primary:
        return str(primary)
    args = getattr(exc, "args", ())
    if len(args) >= 2 and isinstance(args[0], int):  # MySQL drivers: (errno, message)
        return str(args[1])
    return str(exc)


def exit_code(exc: BaseException | None) -> int:
    """The exit code for how a run ended, as the chart's podFailurePolicy example expects.

    0 success (None); 2 bad input, configuration or misuse; 3 refused by the fence (do not
    retry: FailJob); 1 anything else (a retry may help). A driver's own exception carrying a
    refusal (SF001..SF004) counts as refused too.
    """
    if exc is None:
        return 0
    if isinstance(exc, SingletonError):
        return exc.exit_code
    if refusal_from(exc) is not None:
        return 3
    return 1
