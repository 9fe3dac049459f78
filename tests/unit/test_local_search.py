"""Adaptive search end to end on the local backend: real worker processes, real
harness, real SQLite; trials pause at their grant, promoted ones resume from
their checkpoint in a new job, weak running trials stop through the stop file.
The same capability on Slurm is tested in tests/integration/test_search_cluster.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from dlhpc.store import Attempt, Decision, Store, Trial
from tests.unit._cli import run, status, tick, until_over

# Loss falls with the step and is ordered by x at every step, so the best trial
# is known (smallest x). The checkpoint is a JSON file with the last step done.
TRAIN = """\
import json, time, dlhpc
from pathlib import Path
ctx = dlhpc.init()
ckpt = Path(ctx.checkpoint_dir) / "step.json"
ckpt.parent.mkdir(parents=True, exist_ok=True)
start = json.loads(ckpt.read_text())["step"] if ckpt.exists() else 0
log = Path(ctx.checkpoint_dir) / "resumes.txt"
with log.open("a") as f:
    f.write(f"{start}->{ctx.max_length}\\n")
x = float(ctx.hparams["x"])
for step in range(start + 1, ctx.max_length + 1):
    time.sleep(float(ctx.hparams.get("sleep", 0)))
    ctx.report(step, {"loss": x + 1.0 / step})
    ctx.flush()
    ckpt.write_text(json.dumps({"step": step}))
    if ctx.should_stop():
        ctx.exit_for_requeue()
ctx.close()
"""


@pytest.fixture(autouse=True)
def _local_site(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DLHPC_SITE", "local")


def _launch(tmp_path: Path, searcher: str, extra_hp: str = "") -> int:
    d = tmp_path / "exp"
    d.mkdir()
    (d / "train.py").write_text(TRAIN)
    (d / "exp.yaml").write_text(
        "name: local-asha\nentrypoint: python train.py\n"
        f"hyperparameters:\n  x: {{type: double, minval: 0, maxval: 1}}\n{extra_hp}"
        f"searcher: {searcher}\n"
    )
    res = run("launch", str(d / "exp.yaml"), "--json")
    assert res.exit_code == 0, res.output
    return int(json.loads(res.output)["experiment_id"])


def test_asha_pauses_promotes_resumes_and_completes_the_best(tmp_path: Path, home: Path) -> None:
    exp_id = _launch(
        tmp_path,
        "{name: asha, proposer: random, metric: loss, max_trials: 9, max_length: 9, divisor: 3,"
        " max_rungs: 3, max_concurrent_trials: 3, seed: 4}",
    )
    exp = until_over(exp_id, timeout=180, pause=0.3)
    assert exp["state"] == "COMPLETED"
    states = sorted(t["state"] for t in exp["trials"])
    assert len(states) == 9 and states.count("COMPLETED") == 1
    assert states.count("STOPPED_EARLY") == 8
    best = min(exp["trials"], key=lambda t: t["hparams"]["x"])
    assert best["state"] == "COMPLETED" and best["steps_completed"] == 9

    store = Store(home)
    with store.read() as s:
        trials = s.scalars(select(Trial).where(Trial.experiment_id == exp_id)).all()
        by_len = sorted(t.max_length for t in trials)
        assert by_len == [1] * 6 + [3] * 2 + [9]  # rung sizes 9, 3, 1
        promoted = [t for t in trials if t.max_length > 1]
        for t in promoted:
            # every grant ran in its own job; a pause is not a restart
            attempts = s.scalars(select(Attempt).where(Attempt.trial_id == t.id)).all()
            assert [a.cause for a in attempts][:-1] == ["paused"] * (len(attempts) - 1)
            assert t.restarts == 0
        # max_concurrent_trials bounds the jobs running at once (pauses free their slot)
        spans = [
            (a.started_at, a.ended_at)
            for a in s.scalars(select(Attempt).join(Trial).where(Trial.experiment_id == exp_id))
        ]
        assert all(start and end for start, end in spans)
        edges = sorted([(st, 1) for st, _ in spans] + [(en, -1) for _, en in spans])
        running, peak = 0, 0
        for _, delta in edges:
            running += delta
            peak = max(peak, running)
        assert 1 < peak <= 3
        decisions = s.scalars(select(Decision).where(Decision.experiment_id == exp_id)).all()
        promotes = [d for d in decisions if d.kind == "promote"]
        assert sorted(d.length for d in promotes) == [3, 3, 3, 9]
        assert all(d.acted_at is not None and d.result_time is not None for d in decisions)
        assert all(d.acted_at >= d.result_time for d in decisions if d.result_time)  # type: ignore[operator]
        ckpt_roots = {
            t.id: json.loads((Path(t.run_dir) / "trial.json").read_text()) for t in trials
        }
    store.close()
    logs = {
        tid: (Path(spec["checkpoint_dir"]) / "resumes.txt").read_text().split()
        for tid, spec in ckpt_roots.items()
    }
    assert sorted(logs.values(), key=len)[-1] == ["0->1", "1->3", "3->9"]


def test_asha_stop_once_stops_weak_trials_while_they_run(tmp_path: Path, home: Path) -> None:
    exp_id = _launch(
        tmp_path,
        "{name: asha, stop_once: true, metric: loss, max_trials: 6, max_length: 9,"
        " divisor: 3, max_rungs: 3, max_concurrent_trials: 6, seed: 1}",
        extra_hp="  sleep: 0.4\n",
    )
    exp = until_over(exp_id, timeout=180, pause=0.3)
    assert exp["state"] == "COMPLETED"
    stopped = [t for t in exp["trials"] if t["state"] == "STOPPED_EARLY"]
    assert stopped and any(t["state"] == "COMPLETED" for t in exp["trials"])
    store = Store(home)
    with store.read() as s:
        ids = [t["id"] for t in stopped]
        ran = s.scalars(select(Attempt).where(Attempt.trial_id.in_(ids))).all()
        # stopped while running, by the harness at its next step (exit 75), not scancel
        by_stop_file = [a for a in ran if a.exit_code == 75 and a.cause == "stopped"]
        assert by_stop_file
        for a in by_stop_file:
            t = s.get(Trial, a.trial_id)
            assert t is not None and 0 < t.steps_completed < 9 and t.stop_requested_at
    store.close()


def test_reconciler_killed_at_every_point_of_an_asha_search_loses_and_duplicates_nothing(
    tmp_path: Path, home: Path
) -> None:
    """SIGKILL the reconciler (a real ``dlhpc tick`` process) at each failpoint in turn
    while ASHA runs, with a whole pass in this process after each (as cron's next tick):
    the search ends exactly as the rule says, every trial ran each grant once, and every
    promotion was acted on once."""
    import os
    import signal
    import subprocess
    import sys

    exp_id = _launch(
        tmp_path,
        "{name: asha, proposer: random, metric: loss, max_trials: 9, max_length: 9, divisor: 3,"
        " max_rungs: 3, max_concurrent_trials: 3, seed: 4}",
    )
    points = [
        "ingest.before_mark",
        "tick.after_ingest_batch",
        "tick.after_ingest",
        "tick.after_decide",
        "submit.after_sbatch",
        "tick.after_poll",
    ]
    env = {**os.environ, "DLHPC_HOME": str(home), "DLHPC_SITE": "local"}
    deadline = time.monotonic() + 240
    for point in points:  # a pass that does not reach its point is a whole pass: again
        while True:
            proc = subprocess.run(
                [sys.executable, "-m", "dlhpc", "tick", "-q"],
                env={**env, "DLHPC_FAILPOINTS": point},
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            if proc.returncode == -signal.SIGKILL:
                break
            assert proc.returncode == 0, proc.stderr
            assert status(exp_id)["state"] == "ACTIVE", f"over before {point} was reached"
            assert time.monotonic() < deadline, point
            time.sleep(0.3)
        tick()  # after each kill, a whole pass in this process, as cron's next one
    exp = until_over(exp_id, timeout=240, pause=0.3)
    assert exp["state"] == "COMPLETED"
    assert sorted(t["state"] for t in exp["trials"]).count("COMPLETED") == 1
    store = Store(home)
    with store.read() as s:
        trials = s.scalars(select(Trial).where(Trial.experiment_id == exp_id)).all()
        assert sorted(t.request_id for t in trials) == list(range(9))
        assert sorted(t.max_length for t in trials) == [1] * 6 + [3] * 2 + [9]
        decisions = s.scalars(select(Decision).where(Decision.kind == "promote")).all()
        assert sorted(d.length for d in decisions) == [3, 3, 3, 9]
        for t in trials:
            attempts = s.scalars(select(Attempt).where(Attempt.trial_id == t.id)).all()
            grants = 1 + sum(d.trial_id == t.id for d in decisions)
            # one job per grant, unless a submission was orphaned by a kill and redone
            assert len(attempts) >= grants
            causes = [a.cause for a in attempts]
            assert set(causes) <= {"paused", "completed", "stopped", ""}, causes
    store.close()
