"""``status --json`` writes each trial from its rows (``report._status_json``): the text
is ``json.dumps`` of the typed trial's ``to_json()``, byte for byte, over random trials
(attempts with no, one or several GPUs, live and idle ones, missing and odd values;
a one-minute idle window, so that some GPUs are idle)."""

from __future__ import annotations

import io
import json
import random
from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

import pytest

import dlhpc.report.status as status
from dlhpc.report import _status_json
from dlhpc.report.status import iter_status, iter_status_json, status_data
from dlhpc.report.status_model import ExperimentStatus, Head, write_json
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


def _ready(
    pieces: Iterable[tuple[Head, Iterable[str]]],
) -> list[tuple[ExperimentStatus, list[str]]]:
    """``iter_status_json``'s pieces, each head read after its trials (a callable head
    answers only then)."""
    out = []
    for head, trials in pieces:
        texts = list(trials)
        out.append((head if isinstance(head, ExperimentStatus) else head(), texts))
    return out


@pytest.mark.parametrize("seed", range(8))
def test_each_trials_text_is_json_dumps_of_its_typed_trial(
    tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(status, "_now", lambda: NOW)  # live attempts: hours to a fixed now
    store = Store(tmp_path / "home")
    _fill(store, tmp_path, random.Random(seed))
    for limit in (None, 5):
        with store.read() as s:
            typed = [
                (e, [json.dumps(t.to_json()) for t in ts])
                for e, ts in iter_status(s, limit=limit, idle_window_s=60)
            ]
            texts = _ready(iter_status_json(s, limit=limit, idle_window_s=60))
            assert texts == typed
            out = io.StringIO()
            write_json(iter_status_json(s, limit=limit, idle_window_s=60), out)
            want = json.dumps(status_data(s, limit=limit, idle_window_s=60).to_json())
        assert json.dumps(json.loads(out.getvalue())) == want


def test_the_text_without_the_c_encoder_is_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(status, "_now", lambda: NOW)
    store = Store(tmp_path / "home")
    _fill(store, tmp_path, random.Random(99))
    with store.read() as s:
        fast = _ready(iter_status_json(s, idle_window_s=60))
        monkeypatch.setattr(_status_json, "_FLAT", None)
        assert _ready(iter_status_json(s, idle_window_s=60)) == fast


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
        out = io.StringIO()
        with store.read() as s:
            write_json(pieces(s, idle_window_s=60), out)
        texts.append(out.getvalue())
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
        out = io.StringIO()
        with store.read() as s:
            write_json(
                iter_status_json(s, limit=limit), out, finish=lambda e: replace(e, name="done")
            )
        assert {e["name"] for e in json.loads(out.getvalue())["experiments"]} == {"done"}
