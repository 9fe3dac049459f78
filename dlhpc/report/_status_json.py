"""A listed trial's ``status --json`` text straight from its listing rows: the text of
``json.dumps(trial(...).to_json())`` (:mod:`dlhpc.report._status_trials`), without
building the typed objects and their dicts (100,000s per ``status --json``).

The trial's values are read by the helpers of :mod:`dlhpc.report._status_trials`
(``attempt_spans``, ``row_hours``, ``ended_gpu_values``), as the typed trial's are;
what differs is only the writing (stored times are rewritten, not parsed and
formatted; a trial with one attempt, most of them, encodes its hours and GPU once).
Its scalars (numbers, strings, None) are encoded by one call of the C JSON encoder
over a flat list, its items separated by ``"\\0"``, a character no encoded scalar
holds (JSON escapes it in a string); the pieces are then put into templates holding
the keys, in the model's order.
The stored hyperparameter text goes in as it is (``TrialStatus.json_text``'s rule).
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from dlhpc.report._status_gpu import gpu_summary
from dlhpc.report._status_trials import (
    TRIAL_COLS,
    Ctx,
    attempt_spans,
    ended_gpu_values,
    row_hours,
    target_length,
)
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
# _one_attempt's flat list: the head, the attempt's first 7 scalars (key, job_id, ...,
# nodes; its hours are the head's), then its GPU's 2
_KEY, _JOB, _ONE_GPU = _HEAD, _HEAD + 1, _HEAD + 7


def _encoded(values: list[Any]) -> list[str]:
    """Each of ``values`` (scalars) as ``json.dumps`` writes it."""
    if _FLAT is None:
        return [json.dumps(v) for v in values]
    return "".join(_FLAT(values, 0))[1:-1].split(_SEP)


def _time(value: datetime | None) -> str:
    """``json.dumps(iso(value))``: an ISO time's text needs no escapes (digits, ``-:.TZ+``),
    so it is written here, not by the encoder."""
    return "null" if value is None else '"' + value.isoformat() + 'Z"'


def _stored(text: str | None) -> str:
    """:func:`_time` of ``when(text)``, a time as the DB stores it: SQLAlchemy's
    ``YYYY-MM-DD HH:MM:SS.ffffff`` is rewritten as ``isoformat`` writes it (a ``T``, no
    fraction when it is zero) without parsing it; any other form is parsed."""
    if text is None:
        return "null"
    if len(text) == 26 and text[10] == " " and text[19] == ".":
        if text.endswith(".000000"):
            return '"' + text[:10] + "T" + text[11:19] + 'Z"'
        return '"' + text[:10] + "T" + text[11:] + 'Z"'
    return _time(datetime.fromisoformat(text))


def _epoch(value: float) -> str:
    """:func:`_time` of ``_status_gpu.utc(value)``, an epoch time."""
    return '"' + datetime.fromtimestamp(value, tz=timezone.utc).isoformat()[:-6] + 'Z"'


def _gpu(row: Any, rows: list[Any], start: int, stop: int, c: Ctx) -> tuple[Any, ...] | None:
    """The attempt's GPU use (as ``_derive``'s): GPUs, mean utilization and the newest
    sample's time as JSON text; None without samples."""
    live = c.live_gpu.get(row[_NT])
    if live is None:
        values = ended_gpu_values(rows, start, stop)
        return None if values is None else (values[0], values[1], _epoch(values[2]))
    gpu = gpu_summary(live)
    return None if gpu is None else (gpu.gpus, gpu.util_mean, _time(gpu.last_sample_at))


def trial_json(t: Any, rows: list[Any], c: Ctx) -> str:
    """The trial of ``t`` (its :data:`TRIAL_COLS`) and its listing ``rows`` as
    ``json.dumps(trial(t, rows, c).to_json())`` writes it."""
    spans = attempt_spans(rows)
    if len(spans) == 1:  # most trials: written with fewer steps
        return _one_attempt(t, rows, spans[0][1], c)
    return _attempts(t, rows, spans, c)


def _head(t: Any, c: Ctx, gpu_hours: float, cpu_hours: float) -> list[Any]:
    """The trial's first :data:`_HEAD` scalars for the flat list."""
    return [
        t.id, t.state, t.steps_completed, t.max_length,
        target_length(t.state, t.max_length, c.shape), t.best_metric, t.latest_metric,
        t.restarts, t.crashes, t.error, gpu_hours, cpu_hours,
    ]  # fmt: skip


def _one_attempt(t: Any, rows: list[Any], stop: int, c: Ctx) -> str:
    """:func:`trial_json` of a trial with one attempt (``rows[:stop]``): the trial's hours
    and GPU are the attempt's, so each is encoded once."""
    row = rows[0]
    h = row_hours(row, c.now)[3]
    if c.hours is not None:
        c.hours[t.id] = h  # the sum of one attempt's hours from 0.0: h itself
    flat = _head(t, c, round(h * c.shape.gpus, 4), round(h * c.shape.cpus, 4))
    flat += row[_NT + 2 : _NT + 9]  # key, job_id, state, cause, exit_code, lost, nodes
    gpu = _gpu(row, rows, 0, stop, c)
    if gpu is not None:
        flat += gpu[:2]
    p = _encoded(flat)
    gpu_text = trial_gpu = "null"
    if gpu is not None:
        gpus, util = p[_ONE_GPU], p[_ONE_GPU + 1]
        gpu_text = _GPU % (gpus, util, gpu[2])
        trial_gpu = _TRIAL_GPU % (p[_KEY], gpus, util, gpu[2])
    attempt = _ATTEMPT % (
        *p[_KEY:_ONE_GPU],
        _stored(row[_NT + 9]),
        _stored(row[_NT + 10]),
        gpu_text,
        p[10],
        p[11],
    )
    return _trial_text(t, c, p, p[_JOB], trial_gpu, attempt)


def _attempts(t: Any, rows: list[Any], spans: list[tuple[int, int]], c: Ctx) -> str:
    """:func:`trial_json` of a trial with no or several attempts."""
    gpus, cpus, now = c.shape.gpus, c.shape.cpus, c.now
    values: list[Any] = []  # per attempt: _ATTEMPT_N scalars, and its GPU's 2
    times: list[tuple[str, str, str | None]] = []  # per attempt: start, end, GPU's newest
    jobs: dict[str, None] = {}
    latest: tuple[Any, ...] | None = None  # the attempt key and its GPU's 2 values
    latest_at = ""
    hours = 0.0
    for start, stop in spans:
        row = rows[start]
        h = row_hours(row, now)[3]
        values += row[_NT + 2 : _NT + 9]  # key, job_id, state, cause, exit_code, lost, nodes
        values += (round(h * gpus, 4), round(h * cpus, 4))
        gpu = _gpu(row, rows, start, stop, c)
        gpu_at = None
        if gpu is not None:
            values += gpu[:2]
            latest, latest_at = (row[_NT + 2], *gpu[:2]), gpu[2]
            gpu_at = latest_at
        times.append((_stored(row[_NT + 9]), _stored(row[_NT + 10]), gpu_at))
        jobs[row[_NT + 3]] = None
        hours += h
    head = _head(t, c, round(hours * gpus, 4), round(hours * cpus, 4))
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
    job_ids = ", ".join(parts[_HEAD : _HEAD + len(jobs)])
    return _trial_text(t, c, parts, job_ids, trial_gpu, ", ".join(attempts))


def _trial_text(t: Any, c: Ctx, p: list[str], job_ids: str, gpu: str, attempts: str) -> str:
    """The trial's text from its encoded head ``p`` (:func:`_head`'s order) and the
    texts of its job ids, GPU and attempts."""
    idle = c.idle.get(t.id)
    lab = _NO_LAB if t.id not in c.lab.trials else _lab_text(c, t.id)
    return _TRIAL % (
        p[0], p[1], t.hparams_json, *p[2:9], job_ids, p[9], gpu,
        dumps([g.to_json() for g in idle]) if idle else "[]", p[10], p[11], attempts, lab,
    )  # fmt: skip


def _lab_text(c: Ctx, trial_id: int) -> str:
    """The trial's ``"tags"`` and ``"note"`` keys, after a comma."""
    note = c.lab.trial_note(trial_id)
    tags = dumps(list(c.lab.trial_tags(trial_id)))
    return f', "tags": {tags}, "note": {"null" if note is None else dumps(note.to_json())}'
