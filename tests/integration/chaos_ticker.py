"""A login node's cron loop of reconciler passes, for the infrastructure campaign
(:mod:`tests.integration.chaos_infra_campaign`)::

    python -m tests.integration.chaos_ticker NAME --log FILE --stop FILE
        [--every S] [--skew-s S] [--io-delay-s S]

Each pass is what ``dlhpc tick`` does (the store and scheduler pool of ``DLHPC_HOME``
and ``DLHPC_SITE``, one :func:`dlhpc.orchestrator.tick`), every ``--every`` seconds,
until the stop file exists. ``--skew-s`` runs the passes on a clock that far ahead
(negative: behind) of the real one (:class:`tests._clock.SkewedClock`: the files'
time stamps stay the filesystem's); ``--io-delay-s`` puts that sleep before every
file open, rename, unlink, listing and fsync of the process, as a slow network
filesystem would. Each pass appends one JSON line to the log (:class:`Pass`), a
pass that raised included.
"""

from __future__ import annotations

import argparse
import builtins
import io
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from functools import wraps
from pathlib import Path
from typing import Any

from dlhpc.cli._common import open_store, pool_for
from dlhpc.orchestrator import tick
from tests._clock import SkewedClock

__all__ = ["Pass", "read_passes", "slow_file_operations"]

_SLOWED = {
    builtins: ("open",),
    io: ("open",),
    os: ("replace", "rename", "unlink", "scandir", "listdir", "fsync", "mkdir"),
}


@dataclass
class Pass:
    """One pass of one login node's loop (times: epoch seconds, the real clock)."""

    login: str
    start: float
    end: float
    lease_held_elsewhere: bool = False
    stalled: str | None = None
    errors: list[str] = field(default_factory=list)
    raised: str | None = None  # the exception a pass let out: a defect
    submitted: int = 0
    metrics: int = 0
    decisions: int = 0


def read_passes(log: Path) -> list[Pass]:
    """The passes logged so far (a line being written is left out)."""
    out = []
    try:
        text = log.read_text()
    except FileNotFoundError:
        return []
    for line in text.splitlines():
        try:
            out.append(Pass(**json.loads(line)))
        except (ValueError, TypeError):
            continue
    return out


def slow_file_operations(delay_s: float) -> None:
    """Sleep ``delay_s`` before each file operation of this process (see the module)."""

    def slowed(fn: Callable[..., Any]) -> Callable[..., Any]:
        @wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            time.sleep(delay_s)
            return fn(*args, **kwargs)

        return wrapper

    for module, names in _SLOWED.items():
        for name in names:
            setattr(module, name, slowed(getattr(module, name)))


def _one_pass(login: str, skew_s: float) -> Pass:
    start = time.time()
    try:
        store = open_store(None)
        try:
            report = tick(store, pool_for(store), SkewedClock(timedelta(seconds=skew_s)))
        finally:
            store.close()
    except Exception as err:  # recorded, and the loop goes on, as cron would
        return Pass(login, start, time.time(), raised=f"{type(err).__name__}: {err}")
    return Pass(
        login,
        start,
        time.time(),
        report.lease_held_elsewhere,
        report.stalled,
        list(report.errors),
        submitted=report.submitted,
        metrics=report.metrics,
        decisions=report.decisions,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("login")
    ap.add_argument("--log", type=Path, required=True)
    ap.add_argument("--stop", type=Path, required=True)
    ap.add_argument("--every", type=float, default=2.0)
    ap.add_argument("--skew-s", type=float, default=0.0)
    ap.add_argument("--io-delay-s", type=float, default=0.0)
    args = ap.parse_args(argv)
    if args.io_delay_s:
        slow_file_operations(args.io_delay_s)
    while not args.stop.exists():
        done = _one_pass(args.login, args.skew_s)
        with args.log.open("a") as f:
            f.write(json.dumps(asdict(done)) + "\n")
        time.sleep(max(0.0, args.every - (done.end - done.start)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
