"""Fencing for singleton-controller runs: prove, inside each database transaction, that this
process is still the run's current attempt (see docs/fencing.md of singleton-controller).

    run = Run.from_env()
    run.register(conn)                      # once, at start
    with run.transaction(conn) as token:    # or run.fenced(conn, fn)
        ...                                 # writes commit only if still current
"""

from ._errors import (
    AttemptSuperseded,
    ConfigError,
    FenceRefused,
    MisuseError,
    NeverIssued,
    NotPermitted,
    SingletonError,
    StaleToken,
    exit_code,
    refusal_from,
)
from ._run import DEFAULT_TABLE_PREFIX, Run

__all__ = [
    "DEFAULT_TABLE_PREFIX",
    "AttemptSuperseded",
    "ConfigError",
    "FenceRefused",
    "MisuseError",
    "NeverIssued",
    "NotPermitted",
    "Run",
    "SingletonError",
    "StaleToken",
    "exit_code",
    "refusal_from",
]
__version__ = "0.2.0"
