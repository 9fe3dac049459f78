"""A listed trial's ``status --json`` text straight from its listing rows: the text of
``json.dumps(trial(...).to_json())`` (:mod:`dlhpc.report._status_trials`), without
building the typed objects and their dicts (100,000s per ``status --json``).

The trial's values are read by :func:`~dlhpc.report._status_trials.attempts_of`, as
the typed trial's are; what differs is only the writing. Its scalars (numbers,
strings, None) are encoded by one call of the C JSON encoder over a flat list, its
items separated by ``"\\0"``, a character no encoded scalar holds (JSON escapes it in a
string); the pieces are then put into templates holding the keys, in the model's order.
The stored hyperparameter text goes in as it is (``TrialStatus.json_text``'s rule).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from dlhpc.report._status_trials import TRIAL_COLS, Ctx, attempts_of, target_length
from dlhpc.report.status_model import _dumps as dumps
from dlhpc.report.status_model import c_encoder

__all__ = ["trial_json"]

_SEP = "\0"
_FLAT = c_encoder(_SEP)  # for a flat list of scalars only
_NT = len(TRIAL_COLS)  # where a listing row's attempt columns start

_TRIAL = (
    '{"id": %s, "state": %s, "hparams": %s, "steps_completed": %s, "max_length": %s,'
    ' "target_length": %s, "best_metric": %s, "latest_metric": %s, "restarts": %s,'
    ' "crashes": %s, "slurm_job_ids": [%s], "error": %s, "gpu": %s, "idle_gpus": %s,'
    ' "gpu_hours": %s, "cpu_hours": %s, "attempts": [%s]%s}'
)
_NO_LAB = ', "tags": [], "note": null'  # a trial with no tag and no note (most)
_ATTEMPT = (
    '{"key": %s, "job_id": %s, "state": %s, "cause": %s, "exit_code": %s,'
    ' "lost_steps": %s, "node_list": %s, "started_at": %s, "ended_at": %s, "gpu": %s,'
    ' "gpu_hours": %s, "cpu_hours": %s}'
)
_GPU = '{"gpus": %s, "util_mean": %s, "last_sample_at": %s}'
_TRIAL_GPU = '{"attempt_key": %s, "gpus": %s, "util_mean": %s, "last_sample_at": %s}'
_HEAD = 12  # the trial's scalars first in the flat list (see trial_json)
_ATTEMPT_N = 9  # an attempt's scalars, then its GPU's 2 if it has one


def _encoded(values: list[Any]) -> list[str]:
    """Each of ``values`` (scalars) as ``json.dumps`` writes it."""
    if _FLAT is None:
        return [json.dumps(v) for v in values]
    return "".join(_FLAT(values, 0))[1:-1].split(_SEP)


def _time(value: datetime | None) -> str:
    """``json.dumps(iso(value))``: an ISO time's text needs no escapes (digits, ``-:.TZ+``),
    so it is written here, not by the encoder."""
    return "null" if value is None else '"' + value.isoformat() + 'Z"'


def trial_json(t: Any, rows: list[Any], c: Ctx) -> str:
    """The trial of ``t`` (its :data:`TRIAL_COLS`) and its listing ``rows`` as
    ``json.dumps(trial(t, rows, c).to_json())`` writes it."""
    gpus, cpus = c.shape.gpus, c.shape.cpus
    values: list[Any] = []  # per attempt: _ATTEMPT_N scalars, and its GPU's 2
    times: list[tuple[str, str, str | None]] = []  # per attempt: start, end, GPU's newest
    jobs: dict[str, None] = {}
    latest: tuple[Any, ...] | None = None  # the attempt key and its GPU's 2 values
    latest_at = ""
    hours = 0.0
    for row, started, ended, _seen, h, gpu in attempts_of(rows, c):
        values += row[_NT + 2 : _NT + 9]  # key, job_id, state, cause, exit_code, lost, nodes
        values += (round(h * gpus, 4), round(h * cpus, 4))
        gpu_at = None
        if gpu is not None:
            values += (gpu.gpus, gpu.util_mean)
            latest, latest_at = (row[_NT + 2], gpu.gpus, gpu.util_mean), _time(gpu.last_sample_at)
            gpu_at = latest_at
        times.append((_time(started), _time(ended), gpu_at))
        jobs[row[_NT + 3]] = None
        hours += h
    head = [
        t.id, t.state, t.steps_completed, t.max_length,
        target_length(t.state, t.max_length, c.shape), t.best_metric, t.latest_metric,
        t.restarts, t.crashes, t.error, round(hours * gpus, 4), round(hours * cpus, 4),
    ]  # fmt: skip
    if c.hours is not None and times:
        c.hours[t.id] = hours
    head += jobs
    if latest is not None:
        head += latest
    parts = _encoded(head + values)
    at = _HEAD + len(jobs)
    trial_gpu = "null"
    if latest is not None:
        trial_gpu = _TRIAL_GPU % (*parts[at : at + 3], latest_at)
        at += 3
    attempts = []
    for start_text, end_text, gpu_at in times:
        a = parts[at : at + _ATTEMPT_N]
        at += _ATTEMPT_N
        gpu_text = "null"
        if gpu_at is not None:
            gpu_text = _GPU % (parts[at], parts[at + 1], gpu_at)
            at += 2
        attempts.append(_ATTEMPT % (*a[:7], start_text, end_text, gpu_text, a[7], a[8]))
    idle = c.idle.get(t.id)
    lab = _NO_LAB if t.id not in c.lab.trials else _lab_text(c, t.id)
    job_ids = ", ".join(parts[_HEAD : _HEAD + len(jobs)])
    return _TRIAL % (
        parts[0], parts[1], t.hparams_json, *parts[2:9], job_ids, parts[9], trial_gpu,
        dumps([g.to_json() for g in idle]) if idle else "[]", parts[10], parts[11],
        ", ".join(attempts), lab,
    )  # fmt: skip


def _lab_text(c: Ctx, trial_id: int) -> str:
    """The trial's ``"tags"`` and ``"note"`` keys, after a comma."""
    note = c.lab.trial_note(trial_id)
    tags = dumps(list(c.lab.trial_tags(trial_id)))
    return f', "tags": {tags}, "note": {"null" if note is None else dumps(note.to_json())}'
