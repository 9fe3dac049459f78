"""Scale: one tick and ``status_data`` cost a number of SQL statements that does not
grow with the number of trials, and a tick at scale still ingests, decides and submits
the right things. Timings are measured by ``scripts/bench/scale/bench_scale.py``, not here.

State is synthetic (bulk rows, as after a long random search): ``total`` trials of
which ``LIVE`` run (each with one new event file; ``FINISHING`` of them exit 0 this
tick), the rest COMPLETED. Slurm is faked at the backend boundary (the fake of
``scripts/bench/scale/_bench_scale_state.py``: ``poll`` answers from a JSON file). ``--long`` runs
10,000 trials against 200.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from sqlalchemy import Engine, event, func, insert, select

from dlhpc.config import load_experiment
from dlhpc.config.serde import to_jsonable
from dlhpc.orchestrator import tick
from dlhpc.orchestrator.pool import SchedulerPool
from dlhpc.orchestrator.runfiles import write_trial_specs
from dlhpc.orchestrator.stored import searcher_of
from dlhpc.protocol import trial_dir
from dlhpc.report.status import status_data
from dlhpc.scheduler.plugins import Backend, BackendTable
from dlhpc.search import Create, SearcherTable
from dlhpc.store import Attempt, IngestedFile, Metric, Store, Trial, tables, utcnow
from tests.unit._spec import make_spec

LIVE = 12
FINISHING = 4  # live trials whose job exits 0 this tick
LENGTH = 5
SCRIPTS = Path(__file__).resolve().parents[2] / "scripts" / "bench" / "scale"
EXPERIMENT = """\
name: scale
entrypoint: python train.py
resources: {{cpus_per_task: 1, mem: "1G", time: "01:00:00"}}
hyperparameters:
  x: {{type: double, minval: 0.0, maxval: 1.0}}
searcher: {{name: random, metric: loss, max_trials: {max_trials},
  max_concurrent_trials: {live}, max_length: {length}, seed: 1}}
"""


def _bench_state() -> ModuleType:
    """``scripts/bench/scale/_bench_scale_state.py`` (its fake Slurm backend)."""
    name = "_bench_scale_state"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
        assert spec is not None and spec.loader is not None
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def _event(kind: str, **fields: Any) -> str:
    return json.dumps({"type": kind, "time": 1.7e9, **fields}) + "\n"


def _build(home: Path, total: int) -> Store:
    """``total`` trials: ``total - LIVE`` COMPLETED, ``LIVE`` RUNNING (see the module doc)."""
    yaml = home.parent / f"exp-{total}.yaml"
    yaml.write_text(EXPERIMENT.format(max_trials=total + 50, live=LIVE, length=LENGTH))
    cfg = load_experiment(yaml, site="local", searchers=SearcherTable())
    searcher = searcher_of(cfg, "{}")
    creates = [op for op in searcher.ask(total) if isinstance(op, Create)]
    store = Store(home)
    now = utcnow()
    trials, attempts, metrics, files, samples, ckpts = [], [], [], [], [], []
    jobs: dict[str, str] = {}
    for i, op in enumerate(creates):
        tid, live = i + 1, i >= total - LIVE
        steps = 2 if live else LENGTH
        tdir = store.runs_root / "exp-000001" / "trials" / f"trial-{tid:06d}"
        for step in range(1, steps + 1):
            loss = op.hparams["x"] / step
            searcher.tell(op.request_id, step, loss)
            metrics += [
                {
                    "trial_id": tid,
                    "attempt_id": tid,
                    "step": step,
                    "name": n,
                    "value": v,
                    "time": 1.6e9 + step,
                }
                for n, v in (("loss", loss), ("acc", 1 - loss))
            ]
            samples.append(
                {"attempt_id": tid, "time": 1.6e9 + step, "host": "n1", "gpu_index": 0, "util": 80}
            )
        if not live:
            searcher.tell_exited(op.request_id)
        trials.append(
            {
                "id": tid,
                "experiment_id": 1,
                "request_id": op.request_id,
                "state": "RUNNING" if live else "COMPLETED",
                "hparams_json": json.dumps(op.hparams),
                "max_length": LENGTH,
                "seed": tid,
                "run_dir": str(tdir),
                "steps_completed": steps,
                "best_metric": op.hparams["x"] / steps,
                "latest_metric": op.hparams["x"] / steps,
                "told_step": steps,
                "created_at": now,
                "ended_at": None if live else now - timedelta(days=1),
            }
        )
        job = f"{100 + i // 1000}_{i % 1000}"
        attempts.append(
            {
                "id": tid,
                "trial_id": tid,
                "attempt_key": f"{job}.r0",
                "job_id": job,
                "state": "RUNNING" if live else "COMPLETED",
                "created_at": now,
                "started_at": now - timedelta(hours=1),
                "ended_at": None if live else now - timedelta(days=1),
                "exit_code": None if live else 0,
                "cause": "" if live else "completed",
            }
        )
        ckpts.append(
            {
                "trial_id": tid,
                "attempt_id": tid,
                "step": steps,
                "path": f"/nonexistent/ckpt-{steps:010d}",
                "created_at": now,
            }
        )
        if not live:
            continue
        finishing = i >= total - FINISHING
        jobs[job] = "COMPLETED" if finishing else "RUNNING"
        adir = tdir / "attempts" / f"{job}.r0"
        adir.mkdir(parents=True)
        (adir / "user-r0-00000000.jsonl").write_text(_event("start", host="n1"))
        files.append(
            {"attempt_id": tid, "name": "user-r0-00000000.jsonl", "records": 1, "ingested_at": now}
        )
        last = LENGTH if finishing else 3
        body = "".join(
            _event("metric", step=s, metrics={"loss": op.hparams["x"] / s, "acc": 0.5})
            for s in range(3, last + 1)
        )
        body += _event("gpu", host="n1", gpus=[{"index": 0, "util": 90}])
        if finishing:
            body += _event("exit", code=0, reason="", step=LENGTH, checkpoint_step=LENGTH)
        (adir / "user-r0-00000001.jsonl").write_text(body)
    exp = {
        "id": 1,
        "name": "scale",
        "state": "ACTIVE",
        "backend": "local",
        "site": "local",
        "searcher": "random",
        "metric": "loss",
        "smaller_is_better": True,
        "source_path": str(yaml),
        "yaml_text": "",
        "config_json": json.dumps(to_jsonable(cfg), sort_keys=True),
        "run_dir": str(store.runs_root / "exp-000001"),
        "searcher_state": json.dumps(searcher.state_dict()),
        "created_at": now,
    }
    with store.write() as s:
        for model, rows in (
            (tables.Experiment, [exp]),
            (tables.Trial, trials),
            (tables.Attempt, attempts),
            (tables.IngestedFile, files),
            (tables.Metric, metrics),
            (tables.GpuSample, samples),
            (tables.Checkpoint, ckpts),
        ):
            s.execute(insert(model.__table__), rows)  # type: ignore[attr-defined]
    (home / "jobs.json").write_text(json.dumps(jobs))
    return store


@contextmanager
def _statements() -> Iterator[list[str]]:
    """Every SQL statement any engine runs inside the block."""
    seen: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    event.listen(Engine, "before_cursor_execute", count)
    try:
        yield seen
    finally:
        event.remove(Engine, "before_cursor_execute", count)


def _run(tmp_path: Path, total: int) -> dict[str, Any]:
    home = tmp_path / f"home-{total}"
    store = _build(home, total)
    fake = _bench_state().fake_backend(home / "jobs.json")()
    pool = SchedulerPool(
        local_root=home / "local", backends=BackendTable([Backend("local", lambda _r: fake)])
    )
    with _statements() as tick_sql:
        report = tick(store, pool)
    with _statements() as status_sql, store.read() as s:
        data = status_data(s, 1).to_json()["experiments"][0]
    again = tick(store, pool)  # idempotent: nothing new to ingest or submit
    return {
        "store": store,
        "fake": fake,
        "report": report,
        "tick_sql": tick_sql,
        "status_sql": status_sql,
        "status": data,
        "again": again,
    }


def _check_tick(r: dict[str, Any], total: int) -> None:
    """What the tick at scale did: poll once, ingest every new file, tell, submit."""
    report, fake, store = r["report"], r["fake"], r["store"]
    assert report.errors == [] and report.experiments == 1
    assert report.polled_jobs == LIVE and report.scheduler_calls["squeue"] == 1
    assert report.ingested_files == LIVE
    # the finishing trials completed; their slots went to new trials, submitted at once
    assert report.submitted == FINISHING and len(fake.submitted) == FINISHING
    with store.read() as s:
        states = dict(s.execute(select(Trial.state, func.count()).group_by(Trial.state)).all())
        assert states == {
            "COMPLETED": total - LIVE + FINISHING,
            "RUNNING": LIVE - FINISHING,
            "PENDING": FINISHING,
        }
        live = s.scalars(select(Trial).where(Trial.state == "RUNNING")).all()
        assert {t.told_step for t in live} == {3} and {t.steps_completed for t in live} == {3}
        for t in live:  # the loss x / step falls: step 3's is both the best and the latest
            x = json.loads(t.hparams_json)["x"]
            assert t.best_metric == t.latest_metric == pytest.approx(x / 3)
        done = s.scalars(select(Trial).where(Trial.id > total - FINISHING, Trial.id <= total)).all()
        assert {(t.state, t.steps_completed, t.told_step) for t in done} == {
            ("COMPLETED", LENGTH, LENGTH)
        }
        new_jobs = s.scalars(select(Attempt.job_id).where(Attempt.trial_id > total)).all()
        assert sorted(new_jobs) == sorted(fake.submitted)
        assert s.scalar(select(func.count()).select_from(IngestedFile)) == 2 * LIVE
        assert s.scalar(select(func.count()).select_from(Metric)) == 2 * (
            (total - LIVE) * LENGTH + (LIVE - FINISHING) * 3 + FINISHING * LENGTH
        )
    assert r["again"].ingested_files == 0 and r["again"].submitted == 0
    data = r["status"]
    assert len(data["trials"]) == total + FINISHING
    assert sum(t["gpu"] is not None for t in data["trials"]) == total
    # per-trial metric summaries come from grouped queries, one set per ingest batch
    refreshes = [q for q in r["tick_sql"] if "max(metrics.step)" in q]
    assert len(refreshes) <= 2 * math.ceil(LIVE / 64)


def test_tick_and_status_cost_the_same_statements_at_any_size(
    tmp_path: Path, long_run: bool
) -> None:
    big = 10_000 if long_run else 2_000
    small, large = _run(tmp_path, 200), _run(tmp_path, big)
    _check_tick(small, 200)
    _check_tick(large, big)
    assert len(large["tick_sql"]) == len(small["tick_sql"]), (
        len(small["tick_sql"]),
        len(large["tick_sql"]),
    )
    assert len(large["status_sql"]) == len(small["status_sql"])


def test_trial_specs_are_written_a_few_at_a_time_in_order_and_errors_raise(
    tmp_path: Path,
) -> None:
    specs = [make_spec(tmp_path, trial_id=i, hparams={"i": i}) for i in range(1, 21)]
    dirs = write_trial_specs(specs, tmp_path / "runs")
    assert dirs == [trial_dir(tmp_path / "runs", 1, i) for i in range(1, 21)]
    for i, d in enumerate(dirs, start=1):
        assert json.loads((d / "trial.json").read_text())["hparams"] == {"i": i}
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(OSError):
        write_trial_specs(specs, tmp_path / "file")
