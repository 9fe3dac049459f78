"""Synthetic state for ``bench_scale.py`` (and tests/unit/test_scale.py): a long ASHA
search of N trials as bulk rows, the live jobs' folders, and a fake Slurm backend.

:func:`build` drives a real ASHA searcher (``stop_once``, rungs 9/27/81/243) through a
virtual history of ``trials`` trials (``concurrent`` at a time) and bulk-inserts
(SQLAlchemy Core) what a long search leaves behind into a database the real store
code created: trials (most COMPLETED or STOPPED_EARLY, the rest RUNNING or queued),
attempts (some preempted and resubmitted), metric points (4 names per step),
checkpoints (kept by the keep policy, the rest DELETED), GPU samples, ingested-file
rows, decisions and the searcher state. Only the live attempts get folders, with the
files their jobs wrote: the ingested ones, one new event file each (new steps; some
reach their grant and exit), ``heartbeat.json``, ``progress.json``, and the curve
archive an earlier tick wrote. :func:`fake_backend` is Slurm faked at the
scheduler-backend boundary: ``poll`` answers from a JSON file of job states.
"""

from __future__ import annotations

import getpass
import json
import math
import os
import random
import time
from collections import Counter
from collections.abc import Collection
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

EXPERIMENT = """\
name: bench-scale
entrypoint: python train.py
resources: {{cpus_per_task: 1, mem: "1G", time: "01:00:00"}}
hyperparameters:
  lr: {{type: log, minval: -5, maxval: -1}}
  x: {{type: double, minval: 0.0, maxval: 1.0}}
searcher:
  name: asha
  proposer: random
  stop_once: true
  metric: val_loss
  max_trials: {max_trials}
  max_concurrent_trials: {concurrent}
  max_length: 243
  min_length: 9
  divisor: 3
  seed: 1
"""
NAMES = ("val_loss", "train_loss", "lr", "accuracy")
JOBS_FILE = "bench-jobs.json"  # job id -> state, what the fake Slurm answers
T0 = datetime(2026, 1, 1)


# -- the fake scheduler (used by the timed child processes and tests) ----------------


def fake_backend(jobs_file: Path) -> Any:
    """A BaseScheduler whose poll answers from ``jobs_file`` (job id -> JobState value)."""
    from dlhpc.scheduler import BaseScheduler, JobRequest, JobState, JobStatus, SubmittedTask

    class FakeSlurm(BaseScheduler):
        name = "fake-slurm"

        def __init__(self) -> None:
            self.calls: Counter[str] = Counter()
            self.submitted: list[str] = []
            self.cancelled: list[str] = []

        def render(self, request: JobRequest) -> list[str]:
            return [f"# {len(request.trial_dirs)} tasks"]

        def submit(self, request: JobRequest) -> list[SubmittedTask]:
            self.calls["sbatch"] += 1
            array = 900_000 + len(self.submitted)
            out = []
            for i, d in enumerate(request.trial_dirs):
                log = request.folder / f"{array}_{i}_0_log.out"
                out.append(SubmittedTask(d, f"{array}_{i}", log, None))
            self.submitted += [t.job_id for t in out]
            return out

        def poll(self, job_ids: Collection[str]) -> dict[str, JobStatus]:
            self.calls["squeue"] += 1
            self.calls["sacct"] += 1
            states = json.loads(jobs_file.read_text())
            return {
                j: JobStatus(j, JobState(states.get(j, "UNKNOWN")), node_list="node1")
                for j in job_ids
            }

        def cancel(self, job_ids: Collection[str]) -> None:
            self.calls["scancel"] += 1
            self.cancelled += list(job_ids)

        def log_paths(self, folder: Path, job_id: str) -> list[Path]:
            return [folder / f"{job_id}_0_log.out"]

    return FakeSlurm


def install_fake(jobs_file: Path) -> None:
    """Make the ``local`` backend name build the fake (for this process and its
    children), through the registry's ``$DLHPC_SCHEDULERS`` hook (see :data:`BACKEND`)."""
    os.environ["DLHPC_FAKE_JOBS"] = str(jobs_file)
    os.environ["DLHPC_SCHEDULERS"] = "local=_bench_scale_state:BACKEND"


def __getattr__(name: str) -> Any:
    """``BACKEND``: the fake's registry descriptor, answering from ``$DLHPC_FAKE_JOBS``."""
    if name == "BACKEND":
        from dlhpc.scheduler.plugins import Backend

        jobs_file = Path(os.environ["DLHPC_FAKE_JOBS"])
        return Backend("local", lambda _root: fake_backend(jobs_file)())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- synthetic state -------------------------------------------------------------------


def _loss(hp: dict[str, Any], step: int, rng: random.Random) -> float:
    return (hp["x"] - 0.3) ** 2 + 1.0 / math.sqrt(step) + rng.gauss(0, 0.01)


def _history(cfg: Any, trials: int, rng: random.Random) -> tuple[Any, list[dict[str, Any]]]:
    """Drive the real searcher until ``trials`` are created; returns it and the trials."""
    from dlhpc.orchestrator.stored import searcher_of
    from dlhpc.search import Create, Stop

    searcher = searcher_of(cfg, "{}")
    conc = cfg.searcher.max_concurrent_trials
    recs: list[dict[str, Any]] = []
    running: dict[int, dict[str, Any]] = {}
    while True:
        for op in searcher.ask(max(0, conc - len(running))) if len(recs) < trials else []:
            if isinstance(op, Create) and len(recs) < trials:
                rec = {"rid": op.request_id, "hp": op.hparams, "grant": op.length, "steps": 0}
                rec["state"] = "RUNNING"
                recs.append(rec)
                running[op.request_id] = rec
            elif isinstance(op, Stop) and op.request_id in running:
                running.pop(op.request_id)["state"] = "STOPPED_EARLY"
                searcher.tell_exited(op.request_id)
        if len(recs) >= trials:
            return searcher, recs
        for rid, rec in list(running.items()):
            for _ in range(rng.randint(1, 6)):
                rec["steps"] += 1
                searcher.tell(rid, rec["steps"], _loss(rec["hp"], rec["steps"], rng))
                if rec["steps"] >= rec["grant"]:
                    rec["state"] = "COMPLETED"
                    running.pop(rid)
                    searcher.tell_exited(rid)
                    break


def _event(kind: str, at: float, **fields: Any) -> str:
    return json.dumps({"type": kind, "time": at, **fields}, sort_keys=True) + "\n"


def build(home: Path, trials: int = 10_000, concurrent: int = 400, seed: int = 1) -> dict[str, Any]:
    """Create the state folder ``home`` (DB + live run folders); returns what it made."""
    from sqlalchemy import insert

    from dlhpc.config import load_experiment
    from dlhpc.config.serde import to_jsonable
    from dlhpc.report._curves import archive_trials
    from dlhpc.search import SearcherTable
    from dlhpc.store import Store, tables

    rng = random.Random(seed)
    home.mkdir(parents=True, exist_ok=True)
    yaml_path = home / "exp.yaml"
    yaml_path.write_text(EXPERIMENT.format(max_trials=trials + 50, concurrent=concurrent))
    cfg = load_experiment(
        yaml_path,
        site="local",
        environ={**os.environ, "DLHPC_HOME": str(home)},
        searchers=SearcherTable(),
    )
    searcher, recs = _history(cfg, trials, rng)
    live = [r for r in recs if r["state"] == "RUNNING"]
    queued = {r["rid"] for r in live if r["steps"] == 0}  # created last: still in the queue
    store = Store(home)
    runs = store.runs_root / "exp-000001"
    rows: dict[str, list[dict[str, Any]]] = {
        k: []
        for k in (
            "trials",
            "attempts",
            "submissions",
            "metrics",
            "checkpoints",
            "gpu",
            "files",
            "dec",
        )
    }
    jobs: dict[str, str] = {}
    new_files = running_seen = 0
    ck_root = Path(cfg.checkpoint.dir) / "exp-000001"
    for i, r in enumerate(recs):
        tid, is_live, steps = i + 1, r["state"] == "RUNNING", r["steps"]
        tdir = runs / "trials" / f"trial-{tid:06d}"
        t_start = T0 + timedelta(minutes=i)
        state = ("PENDING" if r["rid"] in queued else "RUNNING") if is_live else r["state"]
        told = 0 if r["rid"] in queued else steps
        losses = {s: _loss(r["hp"], s, rng) for s in range(1, steps + 1)}
        best = min(losses.values()) if losses else None
        rows["trials"].append(
            dict(
                id=tid,
                experiment_id=1,
                request_id=r["rid"],
                state=state,
                hparams_json=json.dumps(r["hp"], sort_keys=True),
                max_length=r["grant"],
                seed=tid,
                run_dir=str(tdir),
                steps_completed=steps,
                best_metric=best,
                latest_metric=losses.get(steps),
                restarts=0,
                crashes=0,
                needs_job=False,
                told_step=told,
                error="",
                created_at=t_start,
                ended_at=None if is_live else t_start + timedelta(minutes=steps),
            )
        )
        sub = i // 1000 + 1
        if i % 1000 == 0:
            rows["submissions"].append(
                dict(
                    id=sub,
                    experiment_id=1,
                    name=f"dlhpc-e1-{sub:08x}",
                    state="SUBMITTED",
                    trial_ids_json="[]",
                    folder=str(runs / "jobs"),
                    created_at=t_start,
                    error="",
                )
            )
        keys = []
        if i % 20 == 7 and steps > 2:  # preempted once, resubmitted as a new job
            keys.append((f"{1000 + sub}_{i % 1000}", "PREEMPTED", "preempted", 75, "requeue/TERM"))
        job = f"{2000 + sub}_{i % 1000}"
        ended = (
            ("COMPLETED", "completed", 0, "")
            if state == "COMPLETED"
            else ("CANCELLED", "stopped", 75, "requeue/TERM")
        )
        keys.append(
            (
                job,
                state if is_live else ended[0],
                "" if is_live else ended[1],
                None if is_live else ended[2],
                "" if is_live else ended[3],
            )
        )
        for k, (jid, a_state, cause, code, reason) in enumerate(keys):
            aid = tid * 2 + k
            rows["attempts"].append(
                dict(
                    id=aid,
                    trial_id=tid,
                    submission_id=sub,
                    attempt_key=f"{jid}.r0",
                    job_id=jid,
                    array_index=int(jid.rsplit("_", 1)[1]),
                    restart_count=0,
                    state=a_state,
                    raw_state=a_state,
                    node_list="node1",
                    host="node1",
                    log_path="",
                    started_at=None if r["rid"] in queued else t_start,
                    ended_at=(None if code is None else t_start + timedelta(minutes=steps)),
                    exit_code=code,
                    exit_reason=reason,
                    created_at=t_start,
                    cause=cause,
                    lost_steps=0 if code is not None else None,
                    env_json="{}",
                )
            )
            if a_state in ("RUNNING", "PENDING"):
                jobs[jid] = a_state
        aid = rows["attempts"][-1]["id"]
        n_files = math.ceil(steps / 3)
        for s, loss in losses.items():
            at = t_start.timestamp() + s * 60
            for name in NAMES:
                v = (
                    loss
                    if name == "val_loss"
                    else (
                        loss * 0.9
                        if name == "train_loss"
                        else (0.001 if name == "lr" else 1 - loss / 2)
                    )
                )
                rows["metrics"].append(
                    dict(trial_id=tid, attempt_id=aid, step=s, name=name, value=v, time=at)
                )
            rows["gpu"].append(
                dict(
                    attempt_id=aid,
                    time=at,
                    host="node1",
                    gpu_index=0,
                    util=rng.randint(60, 99),
                    mem_used=30 << 30,
                    mem_total=80 << 30,
                    power_w=300.0,
                )
            )
        ck_steps = [s for s in (9, 27, 81, 243) if s <= steps] or ([steps] if steps else [])
        keep = {ck_steps[-1], min(ck_steps, key=lambda s: losses[s])} if ck_steps else set()
        for s in ck_steps:
            rows["checkpoints"].append(
                dict(
                    trial_id=tid,
                    attempt_id=aid,
                    step=s,
                    path=str(ck_root / f"ckpt-{s:010d}"),
                    size_bytes=100 << 20,
                    state="ACTIVE" if s in keep else "DELETED",
                    created_at=t_start,
                    metric=losses[s],
                    pinned=False,
                )
            )
        if r["state"] == "STOPPED_EARLY":
            rows["dec"].append(
                dict(
                    experiment_id=1,
                    trial_id=tid,
                    kind="stop",
                    length=steps,
                    decided_at=t_start,
                    result_time=t_start,
                    acted_at=t_start + timedelta(seconds=5),
                )
            )
        if not is_live or r["rid"] in queued:
            tdir_files = [] if not is_live else ["trial.json"]
            for f in tdir_files:
                (tdir / f).parent.mkdir(parents=True, exist_ok=True)
                (tdir / f).write_text("{}")
            continue
        # a running job's folder: its files, all ingested but one new file per attempt
        adir = tdir / "attempts" / f"{job}.r0"
        adir.mkdir(parents=True)
        (tdir / "trial.json").write_text(json.dumps({"hparams": r["hp"]}))
        r["tid"], r["dir"] = tid, str(tdir)
        now = time.time()
        (adir / "heartbeat.json").write_text(json.dumps({"time": now}))
        (adir / "progress.json").write_text(json.dumps({"step": steps, "checkpoint_step": 0}))
        for f in range(n_files):
            name = f"worker-r0-{f:08d}.jsonl"
            body = _event("start", now, host="node1", nodes="node1") if f == 0 else ""
            for s in range(3 * f + 1, min(steps, 3 * f + 3) + 1):
                body += _event("metric", now, step=s, metrics={"val_loss": losses[s]})
            (adir / name).write_text(body)
            rows["files"].append(dict(attempt_id=aid, name=name, records=3, ingested_at=T0))
        new = [s for s in range(steps + 1, min(r["grant"], steps + 3) + 1)]
        running_seen += 1
        finishing = bool(new) and new[-1] >= r["grant"] or running_seen % 10 == 0
        body = "".join(
            _event("metric", now, step=s, metrics={n: _loss(r["hp"], s, rng) for n in NAMES})
            for s in new
        )
        body += _event("gpu", now, host="node1", gpus=[{"index": 0, "util": 85, "mem_used": 1}])
        if finishing:  # exits 0 this tick (a trial at its grant completes, else it crashed)
            code = 0 if new and new[-1] >= r["grant"] else 1
            body += _event("exit", now, code=code, reason="", step=steps, checkpoint_step=0)
            jobs[job] = "COMPLETED" if code == 0 else "FAILED"
        (adir / f"worker-r0-{n_files:08d}.jsonl").write_text(body)
        new_files += 1
    exp = dict(
        id=1,
        name=cfg.name,
        description="",
        state="ACTIVE",
        backend=cfg.backend,
        site=cfg.site.name,
        searcher="asha",
        metric="val_loss",
        smaller_is_better=True,
        source_path=str(yaml_path),
        yaml_text=yaml_path.read_text(),
        config_json=json.dumps(to_jsonable(cfg), sort_keys=True),
        run_dir=str(runs),
        searcher_state=json.dumps(searcher.state_dict()),
        repro_json="{}",
        user=getpass.getuser(),
        created_at=T0,
    )
    batches = [
        (tables.Experiment, [exp]),
        (tables.Submission, rows["submissions"]),
        (tables.Trial, rows["trials"]),
        (tables.Attempt, rows["attempts"]),
        (tables.IngestedFile, rows["files"]),
        (tables.Metric, rows["metrics"]),
        (tables.Checkpoint, rows["checkpoints"]),
        (tables.GpuSample, rows["gpu"]),
        (tables.Decision, rows["dec"]),
    ]
    with store.write() as s:
        for table, batch in batches:
            for j in range(0, len(batch), 50_000):
                s.execute(insert(table.__table__), batch[j : j + 50_000])  # type: ignore[attr-defined]
        rebuild = getattr(tables, "rebuild_gpu_summaries", None)  # schema v4 keeps a summary
        if rebuild is not None:
            rebuild(s.connection())
    # the running trials' curve archives, as earlier page builds (or ticks, before) wrote them
    archive_trials(store, {r["tid"]: r["dir"] for r in recs if r.get("dir")})
    store.close()
    (home / JOBS_FILE).write_text(json.dumps(jobs))
    return {
        "trials": len(recs),
        "live": len(live),
        "queued": len(queued),
        "metrics": len(rows["metrics"]),
        "gpu_samples": len(rows["gpu"]),
        "attempts": len(rows["attempts"]),
        "checkpoints": len(rows["checkpoints"]),
        "new_files": new_files,
        "jobs_ending": sum(v not in ("RUNNING", "PENDING") for v in jobs.values()),
    }


def freshen(home: Path) -> None:
    """Steady state at the moment a run starts: the running jobs' heartbeats are 10 s
    old (healthy), and their curve archives 1 to 10 minutes old (a tick a minute)."""
    now = time.time()
    trials = home / "runs" / "exp-000001" / "trials"
    for beat in trials.glob("trial-*/attempts/*/heartbeat.json"):
        beat.write_text(json.dumps({"time": now - 10}))
    for path in trials.glob("trial-*/curves.h5"):
        age = (int(path.parent.name.split("-")[1]) % 10 + 1) * 60
        os.utime(path, (now - age, now - age))
