"""The optional pyslurm fast path for the queue half of ``poll``.

Where a pyslurm whose version matches the installed Slurm (major.minor, e.g.
pyslurm 22.5.x for Slurm 22.05) imports, the queue is read in-process through
libslurm (``pyslurm.job().find_user``: one ``REQUEST_JOB_USER_INFO`` RPC and
no ``squeue`` process); otherwise through ``squeue``. Accounting (``sacct``)
always goes through the CLI.

Contract:

* :func:`choose` decides once, with its reason, and never raises: a missing
  module, one that fails to import (a libslurm it was built for is gone), a
  version mismatch, ``DLHPC_PYSLURM=0``, all pick the CLI with the reason.
  :func:`poll_path` caches that decision for the process.
* :func:`queue_via_pyslurm` returns exactly what ``parse_squeue`` returns for
  the same jobs (it renders pyslurm's records as squeue lines and parses them
  with the same parser). If pyslurm was chosen and fails, it raises
  :class:`~dlhpc.errors.SchedulerError` naming pyslurm: no silent fallback.
"""

from __future__ import annotations

import functools
import importlib
import os
import re
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from types import ModuleType
from typing import Any

from dlhpc.errors import SchedulerError
from dlhpc.scheduler.base import JobStatus
from dlhpc.scheduler.slurm.parse import parse_squeue

__all__ = [
    "DISABLE_ENV",
    "PollPath",
    "choose",
    "installed_slurm_version",
    "poll_path",
    "queue_via_pyslurm",
    "version_pair",
]

#: Set to ``0`` to keep the CLI path even where pyslurm would match.
DISABLE_ENV = "DLHPC_PYSLURM"
_VERSION_RE = re.compile(r"(\d+)\.(\d+)")


@dataclass(frozen=True)
class PollPath:
    """How ``poll`` reads the queue: ``"pyslurm"`` (with its module) or ``"cli"``."""

    name: str
    reason: str
    module: ModuleType | None = None


def version_pair(text: str) -> tuple[int, int] | None:
    """``"22.05.8"``, ``"slurm 22.05.8"``, ``"22.5.1"`` -> ``(22, 5)``; None if no version."""
    m = _VERSION_RE.search(text)
    return (int(m[1]), int(m[2])) if m else None


def installed_slurm_version() -> str:
    """The Slurm client's version (``scontrol --version``: no RPC); "" when unknown."""
    try:
        proc = subprocess.run(
            ["scontrol", "--version"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout.strip() if proc.returncode == 0 else ""


def _module_version(module: ModuleType) -> str:
    version = getattr(module, "__version__", None)
    if version is None and callable(getattr(module, "version", None)):
        version = module.version()
    return str(version or "")


def choose(
    *,
    importer: Callable[[str], ModuleType] = importlib.import_module,
    slurm_version: Callable[[], str] = installed_slurm_version,
    environ: Mapping[str, str] | None = None,
) -> PollPath:
    """Pick the queue path for this process, with the reason; never raises."""
    env = os.environ if environ is None else environ
    if env.get(DISABLE_ENV, "").strip() == "0":
        return PollPath("cli", f"squeue: pyslurm disabled by {DISABLE_ENV}=0")
    try:
        module = importer("pyslurm")
    except ImportError as err:
        return PollPath("cli", f"squeue: pyslurm is not importable ({err})")
    except Exception as err:  # a compiled module can fail in many ways; all mean "not usable"
        return PollPath("cli", f"squeue: importing pyslurm failed ({type(err).__name__}: {err})")
    theirs = _module_version(module)
    want = version_pair(theirs)
    if want is None:
        return PollPath("cli", f"squeue: pyslurm has no readable version ({theirs!r})")
    try:
        api = tuple(module.slurm_api_version())[:2]
    except Exception as err:
        return PollPath("cli", f"squeue: pyslurm.slurm_api_version() failed ({err})")
    installed = slurm_version()
    have = version_pair(installed)
    label = f"{want[0]}.{want[1]:02d}"
    if have is None:
        return PollPath(
            "cli", f"squeue: cannot tell the installed Slurm's version for pyslurm {theirs}"
        )
    if want != have:
        return PollPath(
            "cli", f"squeue: pyslurm {theirs} is for Slurm {label}, this is {installed.strip()}"
        )
    if api != have:
        return PollPath(
            "cli",
            f"squeue: pyslurm {theirs} was built against Slurm {api[0]}.{api[1]:02d}, "
            f"this is {installed.strip()}",
        )
    return PollPath("pyslurm", f"pyslurm {theirs} matches {installed.strip()}", module)


@functools.cache
def poll_path() -> PollPath:
    """:func:`choose`, once per process."""
    return choose()


def _time(epoch: Any) -> str:
    if not isinstance(epoch, int) or epoch <= 0:
        return "N/A"
    return datetime.fromtimestamp(epoch).isoformat(timespec="seconds")


def _job_field(record: Mapping[str, Any], job_id: Any) -> str:
    array_id = record.get("array_job_id")
    if not array_id:
        return str(record.get("job_id", job_id))
    if record.get("array_task_str"):  # a pending, unsplit array: "0-59%25" or "3,5-9"
        return f"{array_id}_[{record['array_task_str']}]"
    return f"{array_id}_{record.get('array_task_id')}"


def squeue_lines(records: Mapping[Any, Mapping[str, Any]]) -> str:
    """pyslurm ``job().find_user`` records as ``squeue --format=SQUEUE_FORMAT`` lines."""
    lines = []
    for job_id, rec in records.items():
        fields = [
            _job_field(rec, job_id),
            str(rec.get("job_state") or ""),
            str(rec.get("state_reason") or "None"),
            str(rec.get("nodes") or ""),
            _time(rec.get("start_time")),
            _time(rec.get("end_time")),
        ]
        lines.append("|".join(f.replace("|", " ").replace("\n", " ") for f in fields))
    return "\n".join(lines)


def queue_via_pyslurm(module: ModuleType, user: str) -> dict[str, JobStatus]:
    """The user's jobs through pyslurm; SchedulerError (naming pyslurm) when it fails."""
    try:
        records = module.job().find_user(user)
    except Exception as err:
        raise SchedulerError(
            f"pyslurm poll failed ({type(err).__name__}: {err}); pyslurm was chosen for this "
            f"process: set {DISABLE_ENV}=0 to poll with squeue instead"
        ) from err
    if not isinstance(records, Mapping):
        raise SchedulerError(f"pyslurm job().find_user returned {type(records).__name__}")
    return parse_squeue(squeue_lines(records))
