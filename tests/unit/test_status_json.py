"""``status --json`` (``report.status_types.write_json`` over ``iter_status_json``) is
the document the README documents: each experiment's and trial's keys in their order,
times in ISO 8601 with a ``Z``, the stored hyperparameter text as it is, the report
page's fields left out. Checked against a reference written here key by key from the
typed model, over random trials (attempts with no, one or several GPUs, live and idle
ones, missing and odd values; a one-minute idle window, so that some GPUs are idle)."""

from __future__ import annotations

import io
import json
import math
import random
from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import dlhpc.report.status as status
from dlhpc.report.status import iter_status, iter_status_json, status_data
from dlhpc.report.status_types import (
    AttemptStatus,
    CheckedDiskUse,
    ExperimentStatus,
    GpuUse,
    Head,
    IdleGpu,
    LatestNote,
    TrialGpu,
    TrialStatus,
    write_json,
)
from dlhpc.states import JobState, TrialState
from dlhpc.store import Attempt, GpuSample, Store
from tests.unit._db import add_experiment, add_trial

NOW = datetime(2026, 3, 1, 12, 0, 0)
CONFIGS = [
    {
        "resources": {"nodes": 2, "gpus_per_node": 4, "cpus_per_task": 3},
        "searcher": {"max_length": 27},
    },
    {"resources": {"cpus_per_task": 1}},
    {},
]
ODD = [None, "", "a, b", 'q"\\', "é \u2028 \x00 ünï", "\x1f"]


def _metric(rng: random.Random) -> float | None:
    return rng.choice(
        [None, 0.1, 1 / 3, 1e-300, 1e300, float("nan"), float("inf"), -float("inf"), -0.0, 7.5]
    )


def _fill(store: Store, tmp_path: Path, rng: random.Random) -> None:
    states = [s.value for s in TrialState]
    jobs = [s.value for s in JobState]
    with store.write() as s:
        for config in CONFIGS:
            exp = add_experiment(
                s, tmp_path, config_json=json.dumps(config), created_at=NOW, name="ëxp \u2028 ✓"
            )
            for i in range(rng.randint(0, 25)):
                t = add_trial(
                    s, exp, request_id=i, state=rng.choice(states), best_metric=_metric(rng),
                    latest_metric=_metric(rng), error=rng.choice([e for e in ODD if e is not None]),
                    hparams_json=json.dumps({"x": rng.random(), "s": rng.choice(ODD)}),
                    steps_completed=rng.randint(0, 30), max_length=rng.randint(1, 30),
                )  # fmt: skip
                for k in range(rng.randint(0, 3)):
                    start = NOW - timedelta(
                        minutes=rng.randint(1, 500), microseconds=rng.randint(0, 9)
                    )
                    live = rng.random() < 0.3
                    a = Attempt(
                        trial_id=t.id, attempt_key=f"{t.id}.r{k}", job_id=f"{t.id}_{k % 2}",
                        state="RUNNING" if live else rng.choice(jobs),
                        started_at=rng.choice([None, start]),
                        ended_at=None if live else rng.choice([None, start + timedelta(minutes=7)]),
                        terminal_seen_at=rng.choice([None, NOW]), created_at=NOW,
                        cause=rng.choice(["", "preempted"]), exit_code=rng.choice([None, 0, 137]),
                        lost_steps=rng.choice([None, 2]), node_list=rng.choice(["", "n1,n2"]),
                    )  # fmt: skip
                    s.add(a)
                    s.flush()
                    for gpu in range(rng.choice([0, 0, 1, 3])):
                        for n in range(rng.randint(1, 4)):
                            s.add(
                                GpuSample(
                                    attempt_id=a.id, time=NOW.timestamp() - 60.0 * n + 0.25,
                                    host=rng.choice(["n1", "n2"]), gpu_index=gpu,
                                    util=rng.choice([None, 0, 3, 99]),
                                )
                            )  # fmt: skip


def _float(value: float | None) -> float | None:
    """A float as the document holds it: one that is not finite is null."""
    return value if value is None or math.isfinite(value) else None


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat() + "Z"


def _gpu(g: GpuUse | TrialGpu | None) -> dict[str, Any] | None:
    if g is None:
        return None
    key = {"attempt_key": g.attempt_key} if isinstance(g, TrialGpu) else {}
    return {
        **key,
        "gpus": g.gpus,
        "util_mean": g.util_mean,
        "last_sample_at": _iso(g.last_sample_at),
    }


def _note(n: LatestNote | None) -> dict[str, Any] | None:
    if n is None:
        return None
    return {"text": n.text, "user": n.user, "created_at": _iso(n.created_at), "count": n.count}


def _idle(g: IdleGpu) -> dict[str, Any]:
    return {
        "trial_id": g.trial_id, "attempt_key": g.attempt_key, "host": g.host,
        "gpu_index": g.gpu_index, "idle_minutes": g.idle_minutes,
        "idle_since": _iso(g.idle_since), "below_pct": g.below_pct,
    }  # fmt: skip


def _attempt(a: AttemptStatus) -> dict[str, Any]:
    return {
        "key": a.key, "job_id": a.job_id, "state": a.state, "cause": a.cause,
        "exit_code": a.exit_code, "lost_steps": a.lost_steps, "node_list": a.node_list,
        "started_at": _iso(a.started_at), "ended_at": _iso(a.ended_at), "gpu": _gpu(a.gpu),
        "gpu_hours": a.gpu_hours, "cpu_hours": a.cpu_hours,
    }  # fmt: skip


def _trial(t: TrialStatus) -> dict[str, Any]:
    return {
        "id": t.id, "state": t.state, "hparams": json.loads(t.hparams),
        "steps_completed": t.steps_completed, "max_length": t.max_length,
        "target_length": t.target_length, "best_metric": _float(t.best_metric),
        "latest_metric": _float(t.latest_metric), "restarts": t.restarts,
        "crashes": t.crashes, "slurm_job_ids": list(t.slurm_job_ids), "error": t.error,
        "gpu": _gpu(t.gpu), "idle_gpus": [_idle(g) for g in t.idle_gpus],
        "gpu_hours": t.gpu_hours, "cpu_hours": t.cpu_hours,
        "attempts": [_attempt(a) for a in t.attempts], "tags": list(t.tags),
        "note": _note(t.note),
    }  # fmt: skip


def _experiment(e: ExperimentStatus, trials: list[TrialStatus]) -> dict[str, Any]:
    d, lat = e.decisions, e.decisions and e.decisions.latency_s
    disk = e.disk and {
        "checkpoints": e.disk.checkpoints, "checkpoint_bytes": e.disk.checkpoint_bytes,
        "deleted_checkpoints": e.disk.deleted_checkpoints, "freed_bytes": e.disk.freed_bytes,
        "checkpoint_root": e.disk.checkpoint_root,
    }  # fmt: skip
    if disk is not None and isinstance(e.disk, CheckedDiskUse):
        disk["quota_warning"] = e.disk.quota_warning
    return {
        "id": e.id, "name": e.name, "state": e.state, "searcher": e.searcher,
        "metric": e.metric, "smaller_is_better": e.smaller_is_better, "backend": e.backend,
        "created_at": _iso(e.created_at), "ended_at": _iso(e.ended_at), "run_dir": e.run_dir,
        "max_length": e.max_length, "gpus_per_job": e.gpus_per_job,
        "cpus_per_job": e.cpus_per_job, "gpu_hours": e.gpu_hours, "cpu_hours": e.cpu_hours,
        "idle_gpus": [_idle(g) for g in e.idle_gpus], "trials_total": e.trials_total,
        "trial_counts": e.trial_counts,
        "decisions": d and {
            "promotions": d.promotions, "stops": d.stops, "pending": d.pending,
            "latency_s": lat and {"n": lat.n, "median": lat.median, "max": lat.max},
        },
        "disk": disk, "user": e.user, "tags": list(e.tags), "note": _note(e.note),
        "trials": [_trial(t) for t in trials],
    }  # fmt: skip


def _reference(pieces: Iterable[tuple[ExperimentStatus, list[TrialStatus]]]) -> str:
    """The documented document, written key by key from the typed model (key order
    kept: compared as ``json.dumps`` text)."""
    return json.dumps({"experiments": [_experiment(e, ts) for e, ts in pieces]})


def _ready(
    pieces: Iterable[tuple[Head, Iterable[TrialStatus]]],
) -> list[tuple[ExperimentStatus, list[TrialStatus]]]:
    """``iter_status_json``'s pieces, each head read after its trials (a callable head
    answers only then)."""
    out = []
    for head, trials in pieces:
        listed = list(trials)
        out.append((head if isinstance(head, ExperimentStatus) else head(), listed))
    return out


def _written(pieces: Iterable[tuple[Head, Iterable[TrialStatus]]], **kw: Any) -> bytes:
    out = io.BytesIO()
    write_json(pieces, out, **kw)
    return out.getvalue()


@pytest.mark.parametrize("seed", range(8))
def test_status_json_is_the_documented_document(
    tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The streamed pieces are ``iter_status``'s typed ones; their JSON is the
    reference's, and ``status_data``'s own (``to_json``) too."""
    monkeypatch.setattr(status, "_now", lambda: NOW)  # live attempts: hours to a fixed now
    store = Store(tmp_path / "home")
    _fill(store, tmp_path, random.Random(seed))
    for limit in (None, 5):
        with store.read() as s:
            typed = [(e, list(ts)) for e, ts in iter_status(s, limit=limit, idle_window_s=60)]
            assert _ready(iter_status_json(s, limit=limit, idle_window_s=60)) == typed
            text = _written(iter_status_json(s, limit=limit, idle_window_s=60))
            model = status_data(s, limit=limit, idle_window_s=60).to_json()
        want = _reference(typed)
        assert json.dumps(json.loads(text)) == want
        assert json.dumps(model) == want
        assert b'"exit_reason"' not in text and b'"run_dir":"/' in text  # the experiment's


def test_each_trial_is_one_line_and_its_hparams_are_the_stored_text(tmp_path: Path) -> None:
    store = Store(tmp_path / "home")
    with store.write() as s:
        exp = add_experiment(s, tmp_path, name="e")
        for i, hp in enumerate(['{"b": 1, "a": [1e-300, "\\u00e9"]}', "{}"]):
            add_trial(s, exp, request_id=i, hparams_json=hp, best_metric=float("inf"))
    with store.read() as s:
        lines = _written(iter_status_json(s)).decode().splitlines()
    assert len(lines) == 6 and lines[0] == '{"experiments":['  # a head, 2 trials, 2 closers
    assert lines[1].startswith('  {"id":1,') and lines[1].endswith('"trials":[')
    assert lines[2].startswith('    {"id":1,"state":"RUNNING","hparams":{"b": 1, "a": [1e-300,')
    assert '"best_metric":null' in lines[3] and lines[2].endswith("},")  # inf: null
    assert lines[3].endswith('"note":null}') and lines[4:] == ["  ]}", "]}"]


def test_status_help_names_the_listings_row_limit() -> None:
    """``dlhpc status`` says its default listing size without importing rich (--json
    does not need it): the number is cli._views's."""
    from dlhpc.cli import _inspect, _views

    assert _inspect._ROW_LIMIT == _views.ROW_LIMIT


def test_streamed_totals_are_the_summed_pass_totals_byte_for_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Listing every trial, ``iter_status_json`` sums an experiment's hours from its
    trials as they stream (its head follows them); ``iter_status`` sums them in a pass
    over every attempt first. Same text, byte for byte, through ``write_json``: trials
    of 3 to 5 attempts whose run times are awkward (microseconds, 0.18 s multiples that
    round on a half at 4 decimals, negative, missing ends, ends only seen, live ones)."""
    monkeypatch.setattr(status, "_now", lambda: NOW)
    rng = random.Random(7)
    store = Store(tmp_path / "home")
    with store.write() as s:
        for config in CONFIGS[:2]:
            exp = add_experiment(s, tmp_path, config_json=json.dumps(config), name="ü ✓")
            for i in range(40):
                t = add_trial(s, exp, request_id=i, best_metric=_metric(rng))
                for k in range(rng.randint(3, 5)):
                    start = NOW - timedelta(hours=3, microseconds=rng.randint(0, 10**6))
                    span = rng.choice([180_000 * rng.randrange(1, 99, 2), rng.randint(-5, 10**10)])
                    live = rng.random() < 0.1
                    s.add(
                        Attempt(
                            trial_id=t.id, attempt_key=f"{t.id}.r{k}", job_id=f"{t.id}_{k}",
                            state="RUNNING" if live else "PREEMPTED",
                            started_at=rng.choice([start, start, None]),
                            ended_at=None if live else rng.choice(
                                [start + timedelta(microseconds=span)] * 3 + [None]
                            ),
                            terminal_seen_at=rng.choice([None, NOW]), created_at=NOW,
                        )
                    )  # fmt: skip
    texts = []
    for pieces in (iter_status, iter_status_json):
        with store.read() as s:
            texts.append(_written(pieces(s, idle_window_s=60)))
    assert texts[0] == texts[1]
    heads = json.loads(texts[1])["experiments"]
    assert [h["gpu_hours"] > 0 for h in heads] == [False, True]  # newest first: CPU only


def test_a_streamed_head_answers_only_after_its_trials(tmp_path: Path) -> None:
    store = Store(tmp_path / "home")
    _fill(store, tmp_path, random.Random(3))
    with store.read() as s:
        (head, trials), *_ = iter_status_json(s)
        assert not isinstance(head, ExperimentStatus)
        with pytest.raises(RuntimeError, match="before its trials"):
            head()
        list(trials)
        assert head().trials_total == len(_ready(iter_status_json(s))[0][1])


def test_write_json_applies_finish_to_every_head(tmp_path: Path) -> None:
    store = Store(tmp_path / "home")
    _fill(store, tmp_path, random.Random(4))
    for limit in (None, 5):  # streamed and ready heads
        with store.read() as s:
            text = _written(
                iter_status_json(s, limit=limit), finish=lambda e: replace(e, name="done")
            )
        assert {e["name"] for e in json.loads(text)["experiments"]} == {"done"}
