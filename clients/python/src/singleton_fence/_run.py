"""The run as singleton-controller describes it in the SINGLETON_* environment variables."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date, datetime, timezone
from typing import Any, Callable, TypeVar

from . import _db
from ._errors import ConfigError

T = TypeVar("T")

DEFAULT_TABLE_PREFIX = "singleton_"
MAX_TOKEN = 2**63 - 1

_PREFIX = re.compile(r"[a-z][a-z0-9_]{0,31}")
_DECIMAL = re.compile(r"[0-9]+")
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")
# RFC 3339 date-time; checked before fromisoformat, which also takes other ISO 8601 shapes.
_RFC3339 = re.compile(
    r"([0-9]{4}-[0-9]{2}-[0-9]{2})[Tt ]([0-9]{2}:[0-9]{2}:[0-9]{2})(?:\.([0-9]+))?"
    r"([Zz]|[+-][0-9]{2}:[0-9]{2})"
)
_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")


@dataclass(frozen=True)
class Run:
    """One run of a SingletonJob: what it must prove to the database, and its period.

    Read it with :meth:`from_env`; construct it directly in tests. ``attempt`` is needed only
    by :meth:`register` and :meth:`fence`.
    """

    job: str
    token: int
    attempt: str | None = None
    period: datetime | None = None
    idempotency_key: str | None = None
    previous_period: datetime | None = None
    next_period: datetime | None = None
    time_zone: str = "UTC"
    business_date: date | None = None
    period_key: str | None = None
    table_prefix: str = DEFAULT_TABLE_PREFIX

    def __post_init__(self) -> None:
        if not isinstance(self.job, str) or not self.job:
            raise ConfigError("SINGLETON_JOB", "SINGLETON_JOB must not be empty")
        if type(self.token) is not int or not 1 <= self.token <= MAX_TOKEN:
            raise ConfigError(
                "SINGLETON_FENCING_TOKEN",
                f"SINGLETON_FENCING_TOKEN must be an integer from 1 to {MAX_TOKEN}, "
                f"got {self.token!r}",
            )
        if self.attempt is not None and (
            not isinstance(self.attempt, str) or not 1 <= len(self.attempt) <= 253
        ):
            raise ConfigError("SINGLETON_ATTEMPT", "SINGLETON_ATTEMPT must be 1 to 253 characters")
        if self.idempotency_key is not None and not _HEX64.fullmatch(self.idempotency_key):
            raise ConfigError(
                "SINGLETON_IDEMPOTENCY_KEY", "SINGLETON_IDEMPOTENCY_KEY must be 64 hex characters"
            )
        # The prefix is pasted into SQL as an identifier: only this shape may get there.
        if not isinstance(self.table_prefix, str) or not _PREFIX.fullmatch(self.table_prefix):
            raise ConfigError(
                None,
                f"table prefix {self.table_prefix!r} must match ^[a-z][a-z0-9_]{{0,31}}$",
            )

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        table_prefix: str = DEFAULT_TABLE_PREFIX,
    ) -> Run:
        """Read the run from ``environ`` (default ``os.environ``); raises :class:`ConfigError`."""
        env = os.environ if environ is None else environ

        def get(name: str) -> str | None:
            value = env.get(name)
            return value if value else None  # the controller sets optional ones empty

        job = get("SINGLETON_JOB")
        if job is None:
            raise ConfigError("SINGLETON_JOB", "SINGLETON_JOB is not set")
        raw_token = get("SINGLETON_FENCING_TOKEN")
        if raw_token is None:
            raise ConfigError("SINGLETON_FENCING_TOKEN", "SINGLETON_FENCING_TOKEN is not set")
        if (
            len(raw_token) > 20
            or not _DECIMAL.fullmatch(raw_token)
            or not 1 <= int(raw_token) <= MAX_TOKEN
        ):
            raise ConfigError(
                "SINGLETON_FENCING_TOKEN",
                f"SINGLETON_FENCING_TOKEN must be a decimal from 1 to {MAX_TOKEN}, "
                f"got {raw_token!r}",
            )
        return cls(
            job=job,
            token=int(raw_token),
            attempt=get("SINGLETON_ATTEMPT"),
            period=_timestamp("SINGLETON_PERIOD", get("SINGLETON_PERIOD")),
            idempotency_key=get("SINGLETON_IDEMPOTENCY_KEY"),
            previous_period=_timestamp(
                "SINGLETON_PREVIOUS_PERIOD", get("SINGLETON_PREVIOUS_PERIOD")
            ),
            next_period=_timestamp("SINGLETON_NEXT_PERIOD", get("SINGLETON_NEXT_PERIOD")),
            time_zone=get("SINGLETON_TIME_ZONE") or "UTC",
            business_date=_date("SINGLETON_BUSINESS_DATE", get("SINGLETON_BUSINESS_DATE")),
            period_key=get("SINGLETON_PERIOD_KEY"),
            table_prefix=table_prefix,
        )

    def key(self, suffix: str) -> str:
        """``idempotency_key/suffix``: a key for one effect of this run, the same in its retries."""
        if self.idempotency_key is None:
            raise ConfigError("SINGLETON_IDEMPOTENCY_KEY", "SINGLETON_IDEMPOTENCY_KEY is not set")
        return f"{self.idempotency_key}/{suffix}"

    def register(self, conn: Any) -> int:
        """Register this pod as the run's newest attempt; returns its number (1, 2, ...).

        Call once at start, before the work, on a connection with no transaction open: it runs
        in a transaction of its own. Raises :class:`FenceRefused` (a subclass) when refused,
        :class:`MisuseError` when a transaction is open (where the driver tells).
        """
        return _db.register(self, conn)

    def fence(self, conn: Any) -> int:
        """Fence the transaction open on ``conn``: call it first in every transaction that writes.

        Returns the token. In autocommit mode a transaction must have been begun explicitly;
        otherwise the fence's statement starts it. When its statement fails it rolls the
        transaction back (nothing in it commits, the fence row is released); a refusal raises
        :class:`FenceRefused`: do not go on with the run.
        """
        return _db.fence(self, conn)

    @contextmanager
    def transaction(self, conn: Any) -> Iterator[int]:
        """``with run.transaction(conn) as token:`` begins, fences, and commits at the end.

        Any exception in the block (or a refusal) rolls back and propagates.
        """
        with _db.transaction(self, conn) as token:
            yield token

    def fenced(self, conn: Any, fn: Callable[[Any], T]) -> T:
        """Begin a transaction, fence it, run ``fn(conn)``, commit; roll back on any error."""
        with _db.transaction(self, conn):
            return fn(conn)


def _timestamp(name: str, value: str | None) -> datetime | None:
    if value is None:
        return None
    m = _RFC3339.fullmatch(value)
    if m is None:
        raise ConfigError(name, f"{name} must be an RFC 3339 timestamp, got {value!r}")
    day, clock, fraction, offset = m.groups()
    # Normalised so that fromisoformat takes it on every Python from 3.9 (Z, 1..n digits).
    micros = f".{(fraction + '000000')[:6]}" if fraction else ""
    offset = "+00:00" if offset in ("Z", "z") else offset
    try:
        parsed = datetime.fromisoformat(f"{day}T{clock}{micros}{offset}")
    except ValueError as e:
        raise ConfigError(name, f"{name} is not a valid timestamp: {value!r} ({e})") from None
    return parsed.astimezone(timezone.utc)


def _date(name: str, value: str | None) -> date | None:
    if value is None:
        return None
    try:
        if not _DATE.fullmatch(value):
            raise ValueError("not YYYY-MM-DD")
        return date.fromisoformat(value)
    except ValueError:
        raise ConfigError(name, f"{name} must be a date YYYY-MM-DD, got {value!r}") from None
