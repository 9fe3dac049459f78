"""Pure parsers for Slurm's command output (no subprocesses here).

* :func:`expand_job_id` turns ``123_4``, ``123`` and unsplit array ranges such
  as ``123_[5-9%2]`` or ``123_[1,3,7-8]`` into task ids.
* :func:`map_state` folds Slurm's state words into :class:`JobState`.
* :func:`parse_squeue` / :func:`parse_sacct` read the exact formats that
  :data:`SQUEUE_FORMAT` / :data:`SACCT_FORMAT` request.
* :func:`is_system_hold` tells a hold Slurm set itself from one a person set.

Times are Slurm's local wall-clock times (``SLURM_TIME_FORMAT=standard``) and
become naive :class:`~datetime.datetime` objects; ``Unknown``/``None``/``N/A``
become ``None``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime

from dlhpc.scheduler.base import JobState, JobStatus

__all__ = [
    "SACCT_FORMAT",
    "SACCT_RUNS_FORMAT",
    "SQUEUE_FORMAT",
    "SYSTEM_HOLD_REASONS",
    "TASK_ID_RE",
    "base_id",
    "expand_job_id",
    "is_system_hold",
    "map_state",
    "parse_exit_code",
    "parse_max_array_size",
    "parse_sacct",
    "parse_sacct_runs",
    "parse_squeue",
    "parse_time",
    "refused_ids",
]

log = logging.getLogger(__name__)

#: squeue ``--format``: job id, extended state, reason, node list, start, end.
SQUEUE_FORMAT = "%i|%T|%r|%N|%S|%e"
#: sacct ``--format`` (with ``--parsable2``, so ``|``-separated, no trailing ``|``).
SACCT_FORMAT = "JobID,State,ExitCode,NodeList,Start,End,Reason"

#: sacct ``--format`` of :func:`parse_sacct_runs` (with ``-D``: every run of a job).
SACCT_RUNS_FORMAT = "JobID,State,Start"

#: A job id dlhpc may ask about: ``123`` or the array task ``123_4``.
TASK_ID_RE = re.compile(r"^(?P<base>\d+)(?:_(?P<index>\d+))?$")
_RANGE_ID_RE = re.compile(r"^(?P<base>\d+)_\[(?P<spec>[0-9,\-]+)(?:%\d+)?\]$")

_STATES: dict[str, JobState] = {
    "PENDING": JobState.PENDING,
    "RESV_DEL_HOLD": JobState.PENDING,
    "RUNNING": JobState.RUNNING,
    "CONFIGURING": JobState.RUNNING,
    "COMPLETING": JobState.RUNNING,
    "SUSPENDED": JobState.RUNNING,
    "STOPPED": JobState.RUNNING,
    "SIGNALING": JobState.RUNNING,
    "STAGE_OUT": JobState.RUNNING,
    "RESIZING": JobState.RUNNING,
    "UPDATE_DB": JobState.RUNNING,
    "POWER_UP_NODE": JobState.RUNNING,
    "REQUEUED": JobState.REQUEUED,
    "REQUEUE_FED": JobState.REQUEUED,
    "REQUEUE_HOLD": JobState.REQUEUED,
    "SPECIAL_EXIT": JobState.REQUEUED,
    "COMPLETED": JobState.COMPLETED,
    "FAILED": JobState.FAILED,
    "OUT_OF_MEMORY": JobState.FAILED,
    "BOOT_FAIL": JobState.FAILED,
    "DEADLINE": JobState.FAILED,
    "CANCELLED": JobState.CANCELLED,
    "REVOKED": JobState.CANCELLED,
    "TIMEOUT": JobState.TIMEOUT,
    "PREEMPTED": JobState.PREEMPTED,
    "NODE_FAIL": JobState.NODE_FAIL,
}
#: squeue's reason (``%r``: the job's state description when it has one, else the
#: reason code) of a queued job that slurmctld held itself after a failed launch,
#: which starts only once released: 22.05 to 26.05 (the reason code under the first
#: is JobHeldUser; 22.05 says JobHoldMaxRequeue after too many launch requeues,
#: later versions the second text). ``job requeued in held state`` (``scontrol
#: requeuehold``), JobHeldUser and JobHeldAdmin are holds a person set: not these.
SYSTEM_HOLD_REASONS = frozenset(
    {
        "launch failed requeued held",
        "launch failure limit exceeded requeued held",
        "user env retrieval failed requeued held",
        "JobHoldMaxRequeue",
    }
)
_NO_VALUE = {"", "Unknown", "None", "N/A", "(null)", "None assigned"}
_warned_states: set[str] = set()


def base_id(job_id: str) -> str:
    """``123_4`` -> ``123``."""
    return job_id.split("_", 1)[0]


def expand_job_id(raw: str) -> list[str]:
    """Task ids named by one squeue/sacct JobID field; ``[]`` for anything else.

    ``123_4`` -> ``["123_4"]``; ``123`` -> ``["123"]``;
    ``123_[5-7%2]`` -> ``["123_5", "123_6", "123_7"]``. Heterogeneous
    components (``123+0``) and steps (``123.batch``) are not dlhpc's: ``[]``.
    """
    raw = raw.strip()
    if TASK_ID_RE.match(raw):
        return [raw]
    m = _RANGE_ID_RE.match(raw)
    if m is None:
        return []
    ids: list[str] = []
    for part in m["spec"].split(","):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        if not lo or (sep and not hi):
            return []
        ids.extend(f"{m['base']}_{i}" for i in range(int(lo), int(hi or lo) + 1))
    return ids


def map_state(raw: str) -> tuple[JobState, str, str]:
    """(state, Slurm's state word, extra text) of a State field.

    ``"CANCELLED by 1000"`` -> ``(CANCELLED, "CANCELLED", "by 1000")``. An
    unknown word maps to UNKNOWN, with one warning per word and process.
    """
    word, _, extra = raw.strip().partition(" ")
    word = word.rstrip("+")
    state = _STATES.get(word)
    if state is None:
        if word not in _warned_states:
            _warned_states.add(word)
            log.warning("unknown Slurm job state %r: reported as UNKNOWN", word)
        state = JobState.UNKNOWN
    return state, word, extra.strip()


def is_system_hold(state: JobState, reason: str) -> bool:
    """Whether a job in ``state`` with squeue's ``reason`` is queued and held by Slurm
    itself (:data:`SYSTEM_HOLD_REASONS`; pyslurm writes the description's spaces as
    ``_``)."""
    queued = state in (JobState.PENDING, JobState.REQUEUED)
    return queued and reason.replace("_", " ").strip() in SYSTEM_HOLD_REASONS


def parse_exit_code(raw: str) -> int | None:
    """sacct's ``code:signal`` -> the exit code, or 128+signal when killed by one."""
    code, sep, sig = raw.strip().partition(":")
    if not code.isdigit() or (sep and not sig.isdigit()):
        return None
    if sep and int(sig) and not int(code):
        return 128 + int(sig)
    return int(code)


def parse_time(raw: str) -> datetime | None:
    """``2024-05-01T12:00:00`` -> datetime; Slurm's placeholders -> None."""
    raw = raw.strip()
    if raw in _NO_VALUE:
        return None
    try:
        return datetime.fromisoformat(raw)
    except ValueError:
        log.debug("unparsable Slurm time %r", raw)
        return None


def _value(raw: str) -> str:
    raw = raw.strip()
    return "" if raw in _NO_VALUE else raw


_Facts = tuple[datetime | None, datetime | None, int | None]  # start, end, exit code
_SQUEUE_FIELDS = ("id", "state", "reason", "nodes", "start", "end")  # SQUEUE_FORMAT
_SACCT_FIELDS = ("id", "state", "exit", "nodes", "start", "end", "reason")  # SACCT_FORMAT


def _parse_rows(
    text: str,
    command: str,
    names: tuple[str, ...],
    facts: Callable[[JobState, dict[str, str]], _Facts],
) -> dict[str, JobStatus]:
    """Statuses by task id from ``|``-separated rows of the fields ``names``; a row
    of another width is logged and skipped. ``facts`` gives the row's start, end
    and exit code, which the two commands report differently."""
    out: dict[str, JobStatus] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = line.split("|")
        if len(fields) != len(names):
            log.warning("unexpected %s line %r: ignored", command, line)
            continue
        row = dict(zip(names, fields, strict=True))
        state, word, extra = map_state(row["state"])
        start, end, exit_code = facts(state, row)
        for jid in expand_job_id(row["id"]):
            out[jid] = JobStatus(
                job_id=jid,
                state=state,
                raw_state=word,
                node_list=_value(row["nodes"]),
                start=start,
                end=end,
                exit_code=exit_code,
                reason=_value(row["reason"]) or (row["state"].strip() if extra else ""),
            )
    return out


def _squeue_facts(state: JobState, row: dict[str, str]) -> _Facts:
    running = state not in (JobState.PENDING, JobState.REQUEUED, JobState.UNKNOWN)
    return (
        parse_time(row["start"]) if running else None,
        parse_time(row["end"]) if state.is_terminal else None,
        0 if state is JobState.COMPLETED else None,
    )


def _sacct_facts(state: JobState, row: dict[str, str]) -> _Facts:
    exit_code = parse_exit_code(row["exit"]) if state.is_terminal else None
    return parse_time(row["start"]), parse_time(row["end"]), exit_code


def parse_squeue(text: str) -> dict[str, JobStatus]:
    """Statuses by task id from ``squeue --noheader --array --format=SQUEUE_FORMAT``.

    Start/end are kept only where they are facts (start once running, end once
    terminal); squeue's expected times are dropped. squeue shows no exit code:
    it is 0 for COMPLETED (Slurm's meaning of the word) and None otherwise. A job
    Slurm holds itself (:func:`is_system_hold`) has ``system_hold``.
    """
    return {
        jid: replace(st, system_hold=True) if is_system_hold(st.state, st.reason) else st
        for jid, st in _parse_rows(text, "squeue", _SQUEUE_FIELDS, _squeue_facts).items()
    }


def parse_sacct(text: str) -> dict[str, JobStatus]:
    """Statuses by task id from ``sacct -X --noheader --parsable2 --format=SACCT_FORMAT``."""
    return _parse_rows(text, "sacct", _SACCT_FIELDS, _sacct_facts)


def parse_max_array_size(text: str) -> int | None:
    """MaxArraySize from ``scontrol show config``; None when absent."""
    m = re.search(r"^\s*MaxArraySize\s*=\s*(\d+)\s*$", text, re.MULTILINE)
    return int(m.group(1)) if m else None


def parse_sacct_runs(text: str) -> dict[str, list[str]]:
    """Slurm's state word of each run of each task, oldest first, from
    ``sacct -X -D --noheader --parsable2 --format=SACCT_RUNS_FORMAT``.

    ``-D`` lists a requeued job once per run (Slurm 24.11: a first ``PREEMPTED``
    record, then the run now queued or running). Runs are ordered by start time
    (a run not started yet last), so that run ``k`` is the job's restart ``k``
    whatever order sacct prints them in.
    """
    runs: dict[str, list[tuple[datetime, int, str]]] = {}
    for n, line in enumerate(text.splitlines()):
        fields = line.split("|")
        if len(fields) != 3:
            if line.strip():
                log.warning("unexpected sacct line %r: ignored", line)
            continue
        _, word, _ = map_state(fields[1])
        start = parse_time(fields[2]) or datetime.max
        for jid in expand_job_id(fields[0]):
            runs.setdefault(jid, []).append((start, n, word))
    return {jid: [word for *_, word in sorted(rows)] for jid, rows in runs.items()}


def refused_ids(text: str, ids: list[str]) -> list[str]:
    """The ``ids`` that ``scontrol release``'s error output names, in ``ids``' order:
    it writes ``<error> for job <id>``, or ``<id>: <error>`` for an array's task."""
    named = {tok for line in text.splitlines() for tok in re.split(r"[\s:]+", line) if tok}
    return [jid for jid in ids if jid in named]
