"""The Python workload: committed on the current token, refused with a stale one and nothing
written, bad input exits 2; the same cases as the Rust workload's tests/fence.rs."""

from __future__ import annotations

import signal
import threading
import time

import pytest
from conftest import World, workload
from singleton_fence import AttemptSuperseded, FenceRefused, NeverIssued, StaleToken, exit_code

from billing_workload import Committed, run

JAN, FEB, MAR = "2025-01-01T02:00:00Z", "2025-02-01T02:00:00Z", "2025-03-01T02:00:00Z"


def quiet(settings: dict[str, str]) -> Committed:
    return run(settings, lambda _line: None)


def wait_registered(w: World, token: int, attempt: str) -> None:
    deadline = time.monotonic() + 5
    while not w.registered(token, attempt):
        assert time.monotonic() < deadline, f"{attempt} did not register within 5 s"
        time.sleep(0.05)


class Background(threading.Thread):
    """A run in a thread of this process; ``error`` is what it raised."""

    def __init__(self, settings: dict[str, str]) -> None:
        super().__init__(daemon=True)
        self.settings, self.error = settings, None

    def run(self) -> None:
        try:
            quiet(self.settings)
        except Exception as e:  # noqa: BLE001 - the test judges it
            self.error = e


def test_the_current_token_commits_once_and_a_retry_changes_nothing(world: World) -> None:
    world.claim(JAN, 1)
    for _ in range(2):  # the same pod's run again (a retry): one invoice each still
        done = quiet(world.settings(JAN, 1, "pod-a"))
        assert (done.invoices, done.seq) == (3, 1)
    assert world.invoices(JAN) == [1, 1, 1]
    # The ledger is not idempotent, on purpose: each commit is a row.
    assert world.attempts(JAN) == ["pod-a", "pod-a"]


def test_a_stale_token_commits_nothing(world: World) -> None:
    world.claim(JAN, 1)
    # February's claim advances the fence to 2 before January's run (paused, say) starts.
    world.claim(FEB, 2)
    with pytest.raises(StaleToken) as refused:
        quiet(world.settings(JAN, 1, "pod-a"))
    assert exit_code(refused.value) == 3
    world.nothing_written(JAN)
    # The current run is unaffected.
    assert quiet(world.settings(FEB, 2, "pod-b")).invoices == 3


def test_a_run_overtaken_during_its_work_is_refused_at_the_fence(world: World) -> None:
    """The fence itself (step 4): the token was current when the run registered; a newer run is
    claimed during its work, and its transaction is refused at the fence."""
    world.claim(JAN, 1)
    old = Background({**world.settings(JAN, 1, "pod-a"), "BILLING_WORK_SECONDS": "2"})
    old.start()
    wait_registered(world, 1, "pod-a")
    world.claim(FEB, 2)
    old.join(30)
    assert isinstance(old.error, FenceRefused) and old.error.sqlstate == "SF001", old.error
    world.nothing_written(JAN)


def test_a_retired_token_and_a_token_never_issued_are_refused(world: World) -> None:
    world.claim(JAN, 1)
    # A token above the fence never came from the controller.
    with pytest.raises(NeverIssued):
        quiet(world.settings(JAN, 2, "pod-a"))
    # January is decided: its token is retired although it is still the stored fence.
    world.retire(1)
    with pytest.raises(StaleToken):
        quiet(world.settings(JAN, 1, "pod-a"))
    world.nothing_written(JAN)


def test_an_older_pod_of_the_run_commits_nothing_once_its_replacement_registered(
    world: World,
) -> None:
    """A pod of a run that works while its replacement starts (its node stopped answering, say)
    is fenced out by the replacement's registration: only the replacement commits, once."""
    world.claim(JAN, 1)
    old = Background({**world.settings(JAN, 1, "pod-a"), "BILLING_WORK_SECONDS": "2"})
    old.start()
    wait_registered(world, 1, "pod-a")
    assert quiet(world.settings(JAN, 1, "pod-b")).seq == 2
    old.join(30)
    assert isinstance(old.error, AttemptSuperseded), old.error
    assert exit_code(old.error) == 3
    assert world.attempts(JAN) == ["pod-b"]
    assert world.invoices(JAN) == [1, 1, 1]


def test_the_binary_prints_its_run_and_exits_3_when_fenced_out(world: World) -> None:
    world.claim(JAN, 1)
    out, err = workload(world.settings(JAN, 1, "pod-a")).communicate(timeout=60)
    assert out == (
        "invoice run for billing/invoices, period 2025-01-01T02:00:00Z, fencing token 1\n"
        "registered as attempt #1 (pod-a) of this run\n"
        "committed 3 invoice(s) for billing/invoices period 2025-01-01T02:00:00Z under fencing "
        "token 1, attempt #1 (pod-a)\n"
    ), out + err

    world.claim(FEB, 2)
    stale = workload(world.settings(JAN, 1, "pod-c"))
    _, err = stale.communicate(timeout=60)
    assert stale.returncode == 3, err
    assert err.startswith(
        "billing-workload: refused by the fence (SQLSTATE SF001): stale fencing token 1"
    ), err
    assert world.attempts(JAN) == ["pod-a"], "the stale run wrote"


BAD = [
    ("SINGLETON_PERIOD", "not a time", "bad input: SINGLETON_PERIOD"),
    ("SINGLETON_PERIOD", "", "bad input: SINGLETON_PERIOD is not set"),
    ("BILLING_FENCE_FUNCTION", "x; DROP TABLE invoices", "not a lower-case SQL identifier"),
    ("BILLING_FENCE_FUNCTION", "singleton_check", "does not end in `fence`"),
    ("SINGLETON_FENCING_TOKEN", "-1", "bad input: SINGLETON_FENCING_TOKEN"),
    ("SINGLETON_ATTEMPT", "", "bad input: SINGLETON_ATTEMPT"),
    ("SINGLETON_IDEMPOTENCY_KEY", "", "must not be empty"),
    ("DATABASE_URL", "{url}&sslmode=allow-anything", "unknown sslmode"),
    ("BILLING_WORK_SECONDS", "soon", "bad input: BILLING_WORK_SECONDS"),
]


def test_bad_input_exits_2_and_writes_nothing(world: World) -> None:
    world.claim(FEB, 2)
    failures = []
    for variable, value, says in BAD:
        settings = world.settings(FEB, 2, "pod-a")
        settings[variable] = value.format(url=world.url)
        p = workload(settings)
        out, err = p.communicate(timeout=60)
        if p.returncode != 2 or says not in err or out:
            failures.append((variable, value, p.returncode, out, err))
    p = workload(world.settings(FEB, 2, "pod-a"), "--no-such-flag")
    _, err = p.communicate(timeout=60)
    if p.returncode != 2:
        failures.append(("--no-such-flag", p.returncode, err))
    assert not failures, failures
    world.nothing_written(FEB)
    # Flags stand for the variables: the same run from flags alone commits.
    s = world.settings(FEB, 2, "pod-a")
    args = ["--database-url", s["DATABASE_URL"], "--job", s["SINGLETON_JOB"], "--period", FEB]
    args += ["--token", "2", "--idempotency-key", s["SINGLETON_IDEMPOTENCY_KEY"]]
    p = workload({}, *args, "--attempt", "pod-a")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0 and "committed 3 invoice(s)" in out, out + err


@pytest.mark.parametrize("overtaken", [False, True], ids=["commits", "refused"])
def test_sigterm_finishes_the_run_and_the_fence_decides(world: World, overtaken: bool) -> None:
    """SIGTERM does not stop a run half-way: it goes on to its transaction and the fence decides.
    Overtaken by a newer run after its SIGTERM, it is refused."""
    world.claim(JAN, 1)
    p = workload({**world.settings(JAN, 1, "pod-a"), "BILLING_WORK_SECONDS": "2"})
    assert p.stdout is not None
    lines = []
    for line in p.stdout:
        lines.append(line)
        if line.startswith("working for 2 s"):
            p.send_signal(signal.SIGTERM)
            if overtaken:
                world.claim(FEB, 2)
    p.wait(30)
    out, err = "".join(lines), p.stderr.read() if p.stderr else ""
    assert "SIGTERM: finishing this run" in out, out + err
    if overtaken:
        assert p.returncode == 3 and "SQLSTATE SF001" in err, out + err
        world.nothing_written(JAN)
    else:
        assert p.returncode == 0 and "committed 3 invoice(s)" in out, out + err
        assert world.invoices(JAN) == [1, 1, 1]
