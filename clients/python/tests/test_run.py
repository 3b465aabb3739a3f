"""Reading the run from the environment, and the exit-code convention (no database)."""

from __future__ import annotations

from datetime import date, datetime, timezone

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

KEY = "0123456789abcdef" * 4
ENV = {
    "SINGLETON_JOB": "billing/invoices",
    "SINGLETON_FENCING_TOKEN": "42",
    "SINGLETON_ATTEMPT": "6f1c0000-aaaa-bbbb-cccc-000000000001",
    "SINGLETON_PERIOD": "2026-12-06T12:00:00Z",
    "SINGLETON_IDEMPOTENCY_KEY": KEY,
    "SINGLETON_PREVIOUS_PERIOD": "2026-12-05T12:00:00Z",
    "SINGLETON_NEXT_PERIOD": "2026-12-07T12:00:00Z",
    "SINGLETON_TIME_ZONE": "Europe/Berlin",
    "SINGLETON_BUSINESS_DATE": "2026-12-06",
    "SINGLETON_PERIOD_KEY": "2026-12-06T13:00:00+01:00[Europe/Berlin]",
}


def utc(*args) -> datetime:
    return datetime(*args, tzinfo=timezone.utc)


def test_full_environment():
    run = Run.from_env(ENV)
    assert run == Run(
        job="billing/invoices",
        token=42,
        attempt="6f1c0000-aaaa-bbbb-cccc-000000000001",
        period=utc(2026, 12, 6, 12),
        idempotency_key=KEY,
        previous_period=utc(2026, 12, 5, 12),
        next_period=utc(2026, 12, 7, 12),
        time_zone="Europe/Berlin",
        business_date=date(2026, 12, 6),
        period_key="2026-12-06T13:00:00+01:00[Europe/Berlin]",
    )
    assert run.table_prefix == "singleton_"
    assert run.key("invoice/17") == KEY + "/invoice/17"


def test_window_edges_and_defaults():
    env = {**ENV, "SINGLETON_PREVIOUS_PERIOD": "", "SINGLETON_NEXT_PERIOD": ""}
    del env["SINGLETON_TIME_ZONE"]
    run = Run.from_env(env)
    assert run.previous_period is None  # the first run
    assert run.next_period is None  # the last run
    assert run.time_zone == "UTC"

    minimal = Run.from_env({"SINGLETON_JOB": "a/b", "SINGLETON_FENCING_TOKEN": "1"})
    assert (minimal.attempt, minimal.period, minimal.idempotency_key) == (None, None, None)
    with pytest.raises(ConfigError) as config:
        minimal.key("x")
    assert config.value.variable == "SINGLETON_IDEMPOTENCY_KEY"


@pytest.mark.parametrize(
    "value, expected",
    [
        ("2026-12-06T12:00:00Z", utc(2026, 12, 6, 12)),
        ("2026-12-06t12:00:00z", utc(2026, 12, 6, 12)),
        ("2026-12-06T12:00:00.5Z", utc(2026, 12, 6, 12, 0, 0, 500000)),
        ("2026-12-06T12:00:00.123456789Z", utc(2026, 12, 6, 12, 0, 0, 123456)),
        ("2026-12-06T14:00:00+02:00", utc(2026, 12, 6, 12)),
    ],
)
def test_timestamps(value, expected):
    run = Run.from_env({**ENV, "SINGLETON_PERIOD": value})
    assert run.period == expected
    assert run.period.tzinfo == timezone.utc


def test_missing_required():
    for name in ("SINGLETON_JOB", "SINGLETON_FENCING_TOKEN"):
        for env in ({k: v for k, v in ENV.items() if k != name}, {**ENV, name: ""}):
            with pytest.raises(ConfigError) as config:
                Run.from_env(env)
            assert config.value.variable == name
            assert name in str(config.value)
            assert exit_code(config.value) == 2


@pytest.mark.parametrize(
    "name, value",
    [
        ("SINGLETON_FENCING_TOKEN", "0"),
        ("SINGLETON_FENCING_TOKEN", "-1"),
        ("SINGLETON_FENCING_TOKEN", "+5"),
        ("SINGLETON_FENCING_TOKEN", " 5"),
        ("SINGLETON_FENCING_TOKEN", "1e3"),
        ("SINGLETON_FENCING_TOKEN", "4_2"),
        ("SINGLETON_FENCING_TOKEN", "\u0664\u0662"),  # Arabic-Indic digits: int() takes them
        ("SINGLETON_FENCING_TOKEN", "9223372036854775808"),
        ("SINGLETON_FENCING_TOKEN", "9" * 5000),
        ("SINGLETON_PERIOD", "2026-12-06"),
        ("SINGLETON_PERIOD", "2026-12-06T12:00:00"),  # no offset
        ("SINGLETON_PERIOD", "2026-12-32T12:00:00Z"),
        ("SINGLETON_PERIOD", "tomorrow"),
        ("SINGLETON_PREVIOUS_PERIOD", "2026-W49-1T12:00:00Z"),
        ("SINGLETON_NEXT_PERIOD", "2026-12-07 12:00"),
        ("SINGLETON_BUSINESS_DATE", "2026-13-01"),
        ("SINGLETON_BUSINESS_DATE", "20261206"),
        ("SINGLETON_IDEMPOTENCY_KEY", "abc"),
        ("SINGLETON_IDEMPOTENCY_KEY", "g" * 64),
        ("SINGLETON_ATTEMPT", "x" * 254),
    ],
)
def test_invalid(name, value):
    with pytest.raises(ConfigError) as config:
        Run.from_env({**ENV, name: value})
    assert config.value.variable == name
    assert name in str(config.value)


def test_largest_token():
    assert (
        Run.from_env({**ENV, "SINGLETON_FENCING_TOKEN": "9223372036854775807"}).token == 2**63 - 1
    )


@pytest.mark.parametrize("prefix", ["singleton_", "a", "x" * 32, "job2_fence_"])
def test_table_prefix_accepted(prefix):
    assert Run.from_env(ENV, table_prefix=prefix).table_prefix == prefix


@pytest.mark.parametrize(
    "prefix", ["", "x" * 33, "Singleton_", "1abc", "_a", "a-b", "a;drop", "a\n", "a b", "\u00e9"]
)
def test_table_prefix_refused(prefix):
    with pytest.raises(ConfigError, match="table prefix"):
        Run("a/b", 1, table_prefix=prefix)


@pytest.mark.parametrize("token", [0, -1, 2**63, True, "5", 5.0])
def test_explicit_run_validates_the_token(token):
    with pytest.raises(ConfigError) as config:
        Run("a/b", token)
    assert config.value.variable == "SINGLETON_FENCING_TOKEN"
    assert isinstance(config.value, ValueError)


def test_explicit_run_validates_the_job():
    with pytest.raises(ConfigError) as config:
        Run("", 1)
    assert config.value.variable == "SINGLETON_JOB"


def test_exit_codes():
    assert exit_code(None) == 0
    assert exit_code(ConfigError("SINGLETON_JOB", "x")) == 2
    assert exit_code(MisuseError("x")) == 2
    for cls, state in (
        (StaleToken, "SF001"),
        (NotPermitted, "SF002"),
        (NeverIssued, "SF003"),
        (AttemptSuperseded, "SF004"),
    ):
        refused = cls(state, "refused")
        assert isinstance(refused, FenceRefused)
        assert cls.code == state
        assert exit_code(refused) == 3
        assert refusal_from(refused) is refused
    assert exit_code(RuntimeError("connection reset")) == 1
    assert exit_code(KeyboardInterrupt()) == 1


def test_refusal_from_other_errors():
    assert refusal_from(ValueError(31001, "not a driver's error")) is None
    assert refusal_from(RuntimeError("x")) is None
