"""``python -m billing_workload``: the invoice run of examples/billing, in Python. Exit codes: 0
committed (or already committed by this same run), 2 bad input, 3 refused by the fence (do not
retry), 1 anything else (a retry may succeed).

SIGTERM (the pod deleted, say by a Replace) does not stop a run half-way: it goes on to its one
transaction, and the fence decides whether that commits. A run frozen or paused past the start of
a newer run is refused there, which is the point of the example. (The kubelet's SIGKILL after the
grace period still ends it; nothing uncommitted survives that either.)
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from singleton_fence import exit_code

from . import describe, run

# Every flag can come from the environment instead, as in a Job.
SETTINGS = [
    ("--database-url", "DATABASE_URL", "the billing database, a postgres:// URL; sslmode=disable "
     "is plain TCP, any other sslmode (and none) TLS with the certificate and host name verified"),
    ("--sslrootcert", "PGSSLROOTCERT",
     "PEM file of the CA that signed the server's certificate (else the system's CAs)"),
    ("--job", "SINGLETON_JOB", "namespace/name of the SingletonJob: the fence's key"),
    ("--period", "SINGLETON_PERIOD", "the run's scheduled instant (RFC 3339)"),
    ("--token", "SINGLETON_FENCING_TOKEN", "the run's fencing token"),
    ("--idempotency-key", "SINGLETON_IDEMPOTENCY_KEY",
     "stable per job and period: the key for external calls"),
    ("--fence-function", "BILLING_FENCE_FUNCTION", "the fence function, <tablePrefix>fence of the "
     "SingletonJob's backstop (default singleton_fence)"),
    ("--work-seconds", "BILLING_WORK_SECONDS",
     "seconds of work before the fenced transaction (default 0)"),
    ("--attempt", "SINGLETON_ATTEMPT",
     "this attempt's id: the pod's uid, which the controller passes on every container"),
]


def settings(argv: list[str]) -> dict[str, str]:
    """The environment, with the flags given on top."""
    parser = argparse.ArgumentParser(
        prog="billing-workload", description="The billing example's workload: a fenced invoice run"
    )
    for flag, env, help_text in SETTINGS:
        parser.add_argument(flag, dest=env, metavar="VALUE", help=f"{help_text} [env {env}]")
    given = {k: v for k, v in vars(parser.parse_args(argv)).items() if v is not None}
    return {**os.environ, **given}


def _on_sigterm(_signum: int, _frame: object) -> None:
    # Straight to the file descriptor: a print() here could interrupt one of the run's own
    # (sys.stdout refuses a reentrant write); every line of the run is flushed as it is printed.
    os.write(1, b"SIGTERM: finishing this run; the fence decides whether it commits\n")


def main(argv: list[str] | None = None) -> int:
    values = settings(sys.argv[1:] if argv is None else argv)  # exits 2 on an unknown flag
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        done = run(values, lambda line: print(line, flush=True))
    except Exception as e:  # every failure is judged by its exit code
        print(f"billing-workload: {describe(e)}", file=sys.stderr, flush=True)
        return exit_code(e)
    print(done, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
