"""The billing example's workload in Python: the same run as the Rust reference
(examples/billing/workload) and invoice-run.sh, with the fence library singleton_fence
(clients/python) over psycopg 3.

1. Read the run: SINGLETON_JOB, SINGLETON_PERIOD, SINGLETON_FENCING_TOKEN,
   SINGLETON_IDEMPOTENCY_KEY and SINGLETON_ATTEMPT (the pod's uid), set by the controller on every
   container of a run (``Run.from_env``).
2. Register this pod as the run's newest attempt (``run.register``: singleton_attempt in a
   transaction of its own). From then on no older pod of this run commits a fenced write.
3. Work (BILLING_WORK_SECONDS, 0 by default): what takes time before the writes.
4. BEGIN; SELECT singleton_fence(job, token, attempt) (``run.transaction``): refused (SQLSTATE
   SF001 to SF004) unless this run's token is the job's current one and this pod its newest
   attempt; holds the fence row's lock until COMMIT.
5. The writes: the invoices, keyed by (period, customer), so a retry changes nothing; the run's
   summary in invoice_runs; and one row in run_attempts, the run's ledger entry, which is not
   idempotent on purpose (as a debit of a balance is not): only the fence keeps two pods of the
   run from both making it.
6. COMMIT.
"""

from __future__ import annotations

import re
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable

import psycopg
from psycopg.conninfo import conninfo_to_dict
from singleton_fence import ConfigError, FenceRefused, MisuseError, Run

# A plain lower-case SQL identifier, as the Rust workload accepts for the fence function.
_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_$]{0,62}")


@dataclass(frozen=True)
class Committed:
    """A run that committed."""

    job: str
    period: datetime
    token: int
    attempt: str
    seq: int  # this attempt's number in the run (1 for the run's first pod)
    # Invoices of the period in the table after the commit (this run's and any earlier run's of
    # the same period).
    invoices: int

    def __str__(self) -> str:
        return (
            f"committed {self.invoices} invoice(s) for {self.job} period {timestamp(self.period)} "
            f"under fencing token {self.token}, attempt #{self.seq} ({self.attempt})"
        )


def timestamp(t: datetime) -> str:
    """An instant as the Rust workload prints it (jiff): RFC 3339 in UTC, fractional seconds only
    when there are some."""
    t = t.astimezone(timezone.utc)
    fraction = f".{t.microsecond:06d}".rstrip("0") if t.microsecond else ""
    return t.strftime("%Y-%m-%dT%H:%M:%S") + fraction + "Z"


def run(settings: Mapping[str, str], say: Callable[[str], None] = print) -> Committed:
    """Steps 1 to 6 with ``settings`` (the environment, flags over it in ``__main__``); progress
    lines go to ``say``. Raises ConfigError (exit 2), FenceRefused (exit 3) or the driver's
    error (exit 1)."""
    prefix = table_prefix(settings.get("BILLING_FENCE_FUNCTION") or "singleton_fence")
    r = Run.from_env(settings, table_prefix=prefix)
    if not r.job.strip() or not (r.idempotency_key or "").strip():
        raise ConfigError(None, "SINGLETON_JOB and SINGLETON_IDEMPOTENCY_KEY must not be empty")
    if r.period is None:
        raise ConfigError("SINGLETON_PERIOD", "SINGLETON_PERIOD is not set")
    if r.attempt is None:
        raise ConfigError(
            "SINGLETON_ATTEMPT",
            "SINGLETON_ATTEMPT is not set (the pod's uid, which the controller passes on every "
            "container)",
        )
    work = work_seconds(settings.get("BILLING_WORK_SECONDS") or "")
    dsn = conninfo(settings.get("DATABASE_URL") or "", settings.get("PGSSLROOTCERT") or "")
    say(f"invoice run for {r.job}, period {timestamp(r.period)}, fencing token {r.token}")

    # 2. Registration, in a transaction of its own.
    with psycopg.connect(dsn) as conn:
        seq = r.register(conn)
    say(f"registered as attempt #{seq} ({r.attempt}) of this run")
    # 3. The work. A SIGTERM does not cut it short (__main__): the fence decides.
    if work > 0:
        say(f"working for {work} s before the fenced writes")
        time.sleep(work)
    # 4 to 6: one transaction, fenced first; rolled back on any error.
    with psycopg.connect(dsn) as conn:
        with r.transaction(conn):
            invoices = _invoice(conn, r, seq)
    return Committed(r.job, r.period, r.token, r.attempt, seq, invoices)


def _invoice(conn: psycopg.Connection, r: Run, seq: int) -> int:
    """Step 5, in the fenced transaction. Returns the period's invoices."""
    # The natural key (period, customer) makes a retry of this run a no-op.
    conn.execute(
        """INSERT INTO invoices (period, customer, amount_cents, fencing_token, idempotency_key)
           SELECT %(period)s, customer, monthly_cents, %(token)s, %(key)s || '/' || customer
           FROM customers
           ON CONFLICT (period, customer) DO NOTHING""",
        {"period": r.period, "token": r.token, "key": r.idempotency_key},
    )
    # The conditional-update pattern, for stores without a fence function.
    conn.execute(
        """INSERT INTO invoice_runs AS r (period, token, invoices, attempt)
           SELECT %(period)s, %(token)s, count(*), %(attempt)s FROM invoices
           WHERE period = %(period)s
           ON CONFLICT (period) DO UPDATE
             SET token = EXCLUDED.token, invoices = EXCLUDED.invoices, finished_at = now(),
                 attempt = EXCLUDED.attempt
             WHERE r.token <= EXCLUDED.token""",
        {"period": r.period, "token": r.token, "attempt": r.attempt},
    )
    # The run's ledger entry: which attempt (pod) committed, at the database's time. Not
    # idempotent on purpose, as a debit is not.
    conn.execute(
        "INSERT INTO run_attempts (period, token, attempt, seq) VALUES (%s, %s, %s, %s)",
        (r.period, r.token, r.attempt, seq),
    )
    row = conn.execute("SELECT count(*) FROM invoices WHERE period = %s", (r.period,)).fetchone()
    return int(row[0]) if row else 0


def table_prefix(fence_function: str) -> str:
    """The backstop's table prefix from the fence function's name (``<prefix>fence``,
    BILLING_FENCE_FUNCTION): the library calls <prefix>attempt and <prefix>fence, and checks the
    prefix's shape itself."""
    if not _IDENTIFIER.fullmatch(fence_function):
        raise ConfigError(
            "BILLING_FENCE_FUNCTION",
            f"BILLING_FENCE_FUNCTION {fence_function!r} is not a lower-case SQL identifier",
        )
    if not fence_function.endswith("fence"):
        raise ConfigError(
            "BILLING_FENCE_FUNCTION",
            f"BILLING_FENCE_FUNCTION {fence_function!r} does not end in `fence`: "
            "cannot name its attempt function",
        )
    return fence_function[: -len("fence")]


def work_seconds(value: str) -> int:
    if value == "":
        return 0
    if not value.isascii() or not value.isdigit() or len(value) > 9:
        raise ConfigError(
            "BILLING_WORK_SECONDS", f"BILLING_WORK_SECONDS {value!r} is not a number of seconds"
        )
    return int(value)


def conninfo(url: str, root_cert: str) -> str:
    """DATABASE_URL as the Rust workload reads it: ``sslmode=disable`` is plain TCP; any other
    sslmode (and none) is TLS with the server's certificate and host name verified (verify-full),
    against ``root_cert`` (PGSSLROOTCERT) or else the system's CAs."""
    if not url:
        raise ConfigError("DATABASE_URL", "DATABASE_URL is not set")
    if not url.startswith(("postgres://", "postgresql://")):
        raise ConfigError("DATABASE_URL", "DATABASE_URL must be a postgres:// URL")
    base, _, query = url.partition("?")
    verified, kept = True, []
    for pair in filter(None, query.split("&")):
        key, _, value = pair.partition("=")
        if key != "sslmode":
            kept.append(pair)
        elif value == "disable":
            verified = False
        elif value in ("prefer", "require", "verify-ca", "verify-full"):
            verified = True
        else:
            raise ConfigError("DATABASE_URL", f"DATABASE_URL: unknown sslmode {value!r}")
    dsn = base + ("?" + "&".join(kept) if kept else "")
    try:
        conninfo_to_dict(dsn)  # a malformed URL is bad input, not a failure to retry
    except psycopg.Error as e:
        raise ConfigError("DATABASE_URL", f"DATABASE_URL: {e}") from None
    if not verified:
        return psycopg.conninfo.make_conninfo(dsn, sslmode="disable")
    if not root_cert:
        # The system's CAs, as the machine's OpenSSL finds them (psycopg's binary libpq brings
        # its own OpenSSL, whose default paths may be elsewhere: name the file).
        paths = ssl.get_default_verify_paths()
        if not (paths.cafile or paths.capath):
            raise ConfigError(
                None,
                "no CA certificate to verify the database with: set PGSSLROOTCERT, or "
                "sslmode=disable",
            )
        root_cert = paths.cafile or "system"  # libpq 16+: "system" is OpenSSL's default store
    return psycopg.conninfo.make_conninfo(dsn, sslmode="verify-full", sslrootcert=root_cert)


def describe(e: BaseException) -> str:
    """What went wrong, as the Rust workload says it: "bad input: ...", "refused by the fence
    (SQLSTATE SF00n): ...", or "database: ..."."""
    if isinstance(e, FenceRefused):
        return f"refused by the fence (SQLSTATE {e.sqlstate}): {e.message}"
    if isinstance(e, (ConfigError, MisuseError)):
        return f"bad input: {e}"
    if isinstance(e, psycopg.Error):
        primary = e.diag.message_primary if e.sqlstate else None
        if primary:
            return f"database: {primary} (SQLSTATE {e.sqlstate})"
        return f"database: {str(e).strip()}"
    return f"database: {e}"
