"""The workload against the real PostgreSQL (DATABASE_URL; ./test.sh takes it from
hack/postgres.sh url). Each test has a database of its own, with the controller's schema
(clients/testdata/postgres.sql, generated from the controller's code) and the example's
(../schema.sql), dropped at its end. The controller's side, claiming a period (which advances the
fence to its token) and retiring a token, is done here in SQL as the controller does it."""

from __future__ import annotations

import hashlib
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

HERE = Path(__file__).resolve().parent.parent  # examples/billing/python
REPO = HERE.parent.parent.parent


class World:
    """One test's database, and the workload's settings for it."""

    job = "billing/invoices"

    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url
        self.name = "billing_py_" + secrets.token_hex(6)
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {self.name}")
        parts = urlsplit(admin_url)
        self.url = urlunsplit(parts._replace(path="/" + self.name))
        self.db = psycopg.connect(self.url, autocommit=True)
        # The controller's tables and functions, then the example's tables, as users create them.
        for f in (REPO / "clients/testdata/postgres.sql", REPO / "examples/billing/schema.sql"):
            self.db.execute(f.read_text())  # no parameters: several statements in one

    def close(self) -> None:
        self.db.close()
        with psycopg.connect(self.admin_url, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)")

    def claim(self, period: str, token: int) -> None:
        """Claims period for token and advances the fence to it, in one transaction, as the
        controller does before it creates the run's Job."""
        with self.db.transaction():
            self.db.execute(
                """INSERT INTO singleton_claims (job, period, token, job_name)
                   VALUES (%s, %s, %s, %s)""",
                (self.job, period, token, f"invoices-{token}"),
            )
            self.db.execute(
                """INSERT INTO singleton_fences (job, token) VALUES (%s, %s)
                   ON CONFLICT (job) DO UPDATE SET token = EXCLUDED.token""",
                (self.job, token),
            )

    def retire(self, token: int) -> None:
        """Marks token's period decided, as the controller does once the run's Job is over."""
        self.db.execute(
            "UPDATE singleton_fences SET retired = %s WHERE job = %s", (token, self.job)
        )

    def settings(self, period: str, token: int, attempt: str) -> dict[str, str]:
        """A run of period with token, as attempt (pod) attempt, as the controller sets it."""
        key = hashlib.sha256(f"{self.job}/{period}".encode()).hexdigest()
        return {
            "DATABASE_URL": self.url,
            "SINGLETON_JOB": self.job,
            "SINGLETON_PERIOD": period,
            "SINGLETON_FENCING_TOKEN": str(token),
            "SINGLETON_IDEMPOTENCY_KEY": key,
            "SINGLETON_ATTEMPT": attempt,
        }

    def _column(self, column: str, table: str, period: str, order: str) -> list:
        rows = self.db.execute(
            f"SELECT {column} FROM {table} WHERE period = %s ORDER BY {order}", (period,)
        ).fetchall()
        return [r[0] for r in rows]

    def invoices(self, period: str) -> list[int]:
        """The tokens that wrote the period's invoices, by customer."""
        return self._column("fencing_token", "invoices", period, "customer")

    def attempts(self, period: str) -> list[str]:
        """The attempts that committed the period's writes (run_attempts), in commit order."""
        return self._column("attempt", "run_attempts", period, "committed_at")

    def summaries(self, period: str) -> list[int]:
        """The tokens of the period's invoice_runs row (none or one)."""
        return self._column("token", "invoice_runs", period, "token")

    def nothing_written(self, period: str) -> None:
        rows = (self.invoices(period), self.attempts(period), self.summaries(period))
        assert rows == ([], [], []), f"rows written for {period}: {rows}"

    def registered(self, token: int, attempt: str) -> bool:
        row = self.db.execute(
            """SELECT count(*) FROM singleton_attempts
               WHERE job = %s AND token = %s AND attempt = %s""",
            (self.job, token, attempt),
        ).fetchone()
        return bool(row and row[0] == 1)


@pytest.fixture
def world() -> Iterator[World]:
    url = os.environ.get("DATABASE_URL")
    if not url:
        pytest.fail(
            "DATABASE_URL is not set: these tests need a real PostgreSQL "
            "(run ./test.sh, or DATABASE_URL=$(hack/postgres.sh url))"
        )
    w = World(url)
    try:
        yield w
    finally:
        w.close()


def workload(settings: dict[str, str], *args: str, **popen: object) -> subprocess.Popen:
    """The workload as a Job runs it (``python -m billing_workload``), with exactly these
    environment variables."""
    return subprocess.Popen(
        [sys.executable, "-m", "billing_workload", *args],
        cwd=HERE,
        env={**settings, "PYTHONDONTWRITEBYTECODE": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,  # type: ignore[arg-type]
    )
