"""``dlhpc status``: GPU-/CPU-hours per attempt, trial and experiment; the progress of a
paused or stopped trial counts toward the searcher's final length; the attention lines
of ``tick -q`` and ``dlhpc digest`` say an idle GPU once."""

from __future__ import annotations

import io
import json
import os
import random
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from dlhpc.cli import _attention
from dlhpc.cli._views import experiment_view, experiments_table
from dlhpc.cli.main import cli
from dlhpc.errors import NotFoundError
from dlhpc.report.status import iter_status, pick_trials, status_data
from dlhpc.report.status_types import write_json
from dlhpc.states import TrialState
from dlhpc.store import Attempt, Store, utcnow
from tests.unit._db import add_experiment, add_trial
from tests.unit.test_gpu_status import _ingest, running  # noqa: F401 (fixture)

CONFIG = {
    "resources": {"nodes": 2, "gpus_per_node": 4, "tasks_per_node": 4, "cpus_per_task": 8},
    "searcher": {"max_length": 27},
}


def _store(tmp_path: Path, config: dict[str, object]) -> Store:
    store = Store(tmp_path / "home")
    now = utcnow()
    with store.write() as s:
        exp = add_experiment(
            s,
            tmp_path,
            name="usage",
            searcher="asha",
            metric="loss",
            config_json=json.dumps(config),
            created_at=now,
        )
        for i, (state, grant, steps) in enumerate(
            [("PAUSED", 3, 3), ("RUNNING", 9, 4), ("STOPPED_EARLY", 1, 1)]
        ):
            t = add_trial(
                s,
                exp,
                request_id=i,
                state=state,
                max_length=grant,
                seed=i,
                steps_completed=steps,
                created_at=now,
            )
            if i == 0:  # 90 min ended, then 30 min still running (to now)
                spans = [(now - timedelta(minutes=150), now - timedelta(minutes=60), "FAILED")]
                spans.append((now - timedelta(minutes=30), None, "RUNNING"))
            elif i == 1:
                spans = [(None, None, "PENDING")]  # not started: nothing used
            else:
                spans = [(now - timedelta(minutes=15), now, "COMPLETED")]
            for k, (start, end, st) in enumerate(spans):
                s.add(
                    Attempt(
                        trial_id=t.id,
                        attempt_key=f"{i}.r{k}",
                        job_id=f"{i}_{k}",
                        state=st,
                        started_at=start,
                        ended_at=end,
                        created_at=now,
                    )
                )
    return store


def test_gpu_and_cpu_hours_and_progress_targets(tmp_path: Path) -> None:
    store = _store(tmp_path, CONFIG)
    with store.read() as s:
        data = status_data(s)
    (exp,) = data.to_json()["experiments"]
    paused, running_, stopped = exp["trials"]
    assert [a["gpu_hours"] for a in paused["attempts"]] == pytest.approx([12.0, 4.0], abs=0.01)
    assert paused["gpu_hours"] == pytest.approx(16.0, abs=0.01)  # 2 h x 2 nodes x 4 GPUs
    assert paused["cpu_hours"] == pytest.approx(128.0, abs=0.1)  # 2 h x 2 x 4 tasks x 8 CPUs
    assert running_["gpu_hours"] == 0.0 and stopped["gpu_hours"] == pytest.approx(2.0)
    assert exp["gpu_hours"] == pytest.approx(18.0, abs=0.01)
    assert exp["gpus_per_job"] == 8 and exp["cpus_per_job"] == 64 and exp["max_length"] == 27
    # paused and stopped trials: toward the searcher's 27; a running one: its grant
    assert [t["target_length"] for t in exp["trials"]] == [27, 9, 27]
    assert [t["max_length"] for t in exp["trials"]] == [3, 9, 1]  # unchanged (compatible)

    console = Console(width=200, record=True)
    console.print(experiments_table(data), experiment_view(data.experiments[0]))
    text = console.export_text()
    assert "GPU-h" in text and "18.00" in text and "16.00" in text
    assert "3/27" in text and "4/9" in text and "1/27" in text
    assert "resources used: 18.00 GPU-hours, 144 CPU-hours" in text


def test_totals_count_the_trials_a_limited_listing_leaves_out(tmp_path: Path) -> None:
    store = _store(tmp_path, CONFIG)
    with store.read() as s:
        (exp,) = status_data(s, limit=1).to_json()["experiments"]
    # listed: the paused trial (live first); the stopped one's ended attempt is summed in SQL
    assert [t["id"] for t in exp["trials"]] == [1] and exp["trials_total"] == 3
    assert exp["gpu_hours"] == pytest.approx(18.0, abs=0.01)
    assert exp["cpu_hours"] == pytest.approx(144.0, abs=0.1)


def test_streamed_json_is_the_models_json(tmp_path: Path) -> None:
    """``status --json`` is written piece by piece (iter_status, write_json): the same
    document as ``status_data(...).to_json()``; an unknown id raises before anything."""
    store = _store(tmp_path, CONFIG)
    with store.write() as s:  # newest first, and with no trials: an empty list
        add_experiment(s, tmp_path, name="second", created_at=utcnow())
    out = io.BytesIO()
    with store.read() as s:
        want = status_data(s).to_json()
        write_json(iter_status(s), out)
        with pytest.raises(NotFoundError):
            iter_status(s, 99)
    got = json.loads(out.getvalue())
    for e in [*got["experiments"], *want["experiments"]]:  # live attempts: hours to "now"
        e.pop("gpu_hours"), e.pop("cpu_hours")
        for t in e["trials"]:
            for row in (t, *t["attempts"]):
                row.pop("gpu_hours"), row.pop("cpu_hours")
    assert got == want and [len(e["trials"]) for e in got["experiments"]] == [0, 3]
    assert len(out.getvalue().splitlines()) == 1 + 2 + 3 + 2  # a line per trial


def test_cpu_only_runs_count_cpu_hours(tmp_path: Path) -> None:
    store = _store(tmp_path, {"resources": {"cpus_per_task": 2}})  # no searcher length: grant
    with store.read() as s:
        data = status_data(s)
    (exp,) = data.to_json()["experiments"]
    assert exp["gpu_hours"] == 0.0 and exp["cpu_hours"] == pytest.approx(4.5, abs=0.01)
    assert [t["target_length"] for t in exp["trials"]] == [3, 9, 1]
    console = Console(width=200, record=True)
    console.print(experiment_view(data.experiments[0]))
    assert "CPU-h" in console.export_text() and "GPU-h" not in console.export_text()


def test_an_idle_gpu_is_said_once(
    running: tuple[Store, int, Path],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    store, tid, adir = running
    _ingest(store, tid, adir)
    now = utcnow()
    found = _attention.collect(store, now - timedelta(hours=1), now)
    assert [(g["host"], g["gpu_index"]) for g in found.idle] == [("node1", 0)]
    state = tmp_path / "idle.json"
    assert len(_attention.new_idle(found.idle, state)) == 1
    assert _attention.new_idle(found.idle, state) == []  # said already
    assert _attention.new_idle([], state) == []  # busy again: forgotten ...
    assert len(_attention.new_idle(found.idle, state)) == 1  # ... so a new spell is said

    monkeypatch.setenv("DLHPC_HOME", str(store.home))
    monkeypatch.setenv("DLHPC_SITE", "local")
    digest = tmp_path / "digest.txt"
    for _ in range(2):
        res = CliRunner().invoke(cli, ["digest", "--notify", str(digest)])
        assert res.exit_code == 0 and res.output == "", res.output
    text = digest.read_text()
    assert text.count("GPU idle:") == 1
    assert f"GPU idle: experiment 1 trial {tid} on node1 GPU 0: below 10% for 11 min" in text
    res = CliRunner().invoke(cli, ["digest"])  # another target has its own mark: said there
    assert res.exit_code == 0 and "GPU idle: experiment 1" in res.output


def test_digest_pipes_to_mail_and_keeps_it_when_mail_fails(
    running: tuple[Store, int, Path],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    store, tid, adir = running
    _ingest(store, tid, adir)
    bin_dir, sent = tmp_path / "bin", tmp_path / "sent.jsonl"
    bin_dir.mkdir()
    (bin_dir / "mail").write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        f"with open({str(sent)!r}, 'a') as f:\n"
        "    f.write(json.dumps({'argv': sys.argv[1:], 'body': sys.stdin.read()}) + '\\n')\n"
        "sys.exit(int(os.environ.get('FAKE_MAIL_RC', '0')))\n"
    )
    (bin_dir / "mail").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("DLHPC_HOME", str(store.home))
    monkeypatch.setenv("DLHPC_SITE", "local")
    res = CliRunner().invoke(cli, ["cron", "--notify", "mail:me@example.org"])
    assert res.exit_code == 0 and "digest --notify mail:me@example.org" in res.output

    monkeypatch.setenv("FAKE_MAIL_RC", "1")  # mail fails: error, and the digest waits
    res = CliRunner().invoke(cli, ["digest", "--notify", "mail:me@example.org"])
    assert res.exit_code == 1 and "mail failed" in res.output
    monkeypatch.setenv("FAKE_MAIL_RC", "0")
    for _ in range(2):
        res = CliRunner().invoke(cli, ["digest", "--notify", "mail:me@example.org"])
        assert res.exit_code == 0 and res.output == "", res.output
    calls = [json.loads(x) for x in sent.read_text().splitlines()]
    assert len(calls) == 2  # the failed one, then the retry; then nothing new
    assert calls[1]["argv"] == ["-s", "dlhpc: 1 GPU(s) idle", "me@example.org"]
    assert f"trial {tid} on node1 GPU 0" in calls[1]["body"]


@pytest.mark.parametrize("seed", range(6))
def test_a_limited_listing_picks_from_sql_what_a_pick_over_every_trial_would(
    tmp_path: Path, seed: int
) -> None:
    """Two experiments (each metric direction), states, ties and missing metrics at
    random, and an ended trial whose attempt is still live: the trials listed, the
    counts and the hours equal those of the unlimited listing's pick."""
    rng = random.Random(seed)
    store = Store(tmp_path / "home")
    states = [st.value for st in TrialState]
    now = utcnow()
    with store.write() as s:
        for smaller in (True, False):
            exp = add_experiment(s, tmp_path, smaller_is_better=smaller, created_at=now)
            for i in range(rng.randint(0, 60)):
                metric = rng.choice([None, *(round(rng.random(), 1) for _ in range(4))])
                t = add_trial(s, exp, request_id=i, state=rng.choice(states), best_metric=metric)
                if rng.random() < 0.3:
                    live = rng.random() < 0.3
                    s.add(
                        Attempt(
                            trial_id=t.id,
                            attempt_key=f"{t.id}_0.r0",
                            job_id=f"{t.id}_0",
                            state="RUNNING" if live else "COMPLETED",
                            started_at=now - timedelta(hours=rng.randint(1, 9)),
                            ended_at=None if live else now,
                            created_at=now,
                        )
                    )
    with store.read() as s:
        every = {e["id"]: e for e in status_data(s).to_json()["experiments"]}
        for limit in (1, 3, 10, 100):
            for e in status_data(s, limit=limit).to_json()["experiments"]:
                full = every[e["id"]]
                picks = [(t["id"], t["state"], t["best_metric"]) for t in full["trials"]]
                want = pick_trials(picks, e["smaller_is_better"], limit)
                assert {t["id"] for t in e["trials"]} == want
                assert e["trial_counts"] == full["trial_counts"]
                assert e["trials_total"] == full["trials_total"]
                assert e["cpu_hours"] == pytest.approx(full["cpu_hours"], abs=0.01)


def test_the_status_json_encoder() -> None:
    """Times in ISO 8601 with a ``Z`` (microseconds only when there are any), the stored
    hyperparameter text as it is, the page's fields left out (still read as
    attributes), a float that is not finite as null, any text; a quota checked adds
    ``quota_warning``; a value outside the model is an error, not a guess."""
    import datetime as dt

    from dlhpc.report import status_types as m

    at, later = dt.datetime(2026, 3, 1, 12, 0, 0), dt.datetime(2026, 3, 1, 12, 0, 0, 5)
    gpu = m.GpuUse(2, None, later)
    text = 'é ünïcode \u2028 "q" \\'
    a = m.AttemptStatus(
        "7.r0", "7", "FAILED", text, 1, None, None, at, None, gpu, 0.5, 1.0, "why", later
    )
    t = m.TrialStatus(
        7, "RUNNING", m.JsonText('{"b":  1, "a": "é"}'), 3, 9, 9, float("inf"), float("nan"),
        0, 0, ("7",), None, m.TrialGpu.of("7.r0", gpu), (), 0.5, 1.0, (a,), "/runs/t7",
    )  # fmt: skip
    got = m.encode(t)
    assert b'"hparams":{"b":  1, "a": "\xc3\xa9"},' in got  # as stored, byte for byte
    assert b'"best_metric":null,"latest_metric":null,' in got
    assert b'"started_at":"2026-03-01T12:00:00Z","ended_at":null,' in got
    assert b'"last_sample_at":"2026-03-01T12:00:00.000005Z"' in got
    doc = json.loads(got)
    assert doc["attempts"][0]["cause"] == text and doc["gpu"]["attempt_key"] == "7.r0"
    assert list(doc["attempts"][0])[-1] == "cpu_hours" and "run_dir" not in doc
    assert (a.exit_reason, a.terminal_seen_at, t.run_dir) == ("why", later, "/runs/t7")
    assert t.hparams_dict == {"a": "é", "b": 1} and t.to_json() == doc
    disk = m.DiskUse(1, 2, 3, 4, None)
    assert "quota_warning" not in disk.to_json()
    assert disk.with_quota(None).to_json() == {**disk.to_json(), "quota_warning": None}
    with pytest.raises(TypeError):  # orjson.JSONEncodeError
        m.encode({"x": {1, 2}})
