"""``dlhpc simulate``: the real launch/tick on a simulated cluster and virtual clock."""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from dlhpc.cli.main import cli
from dlhpc.config import ExperimentConfig, load_experiment
from dlhpc.config.schema import PreemptionConfig, Resources, SiteConfig
from dlhpc.protocol import STOP_FILE, TrialSpec, read_event_batches
from dlhpc.scheduler import JobRequest, JobState
from dlhpc.search import SearcherTable
from dlhpc.simulate import (
    SIM_EPOCH,
    ClusterSpec,
    RunResult,
    SimCluster,
    SimSettings,
    SyntheticCurves,
    VirtualClock,
    best_reference,
    load_recorded,
    simulate_once,
)
from dlhpc.store import Attempt, Checkpoint, Decision, Experiment, Metric, Store, Trial

REPO = Path(__file__).resolve().parents[2]
DIGITS = REPO / "templates" / "examples" / "digits"


def _yaml(tmp_path: Path, searcher: str, time: str = "01:00:00", gpus: int = 0) -> Path:
    path = tmp_path / "exp.yaml"
    path.write_text(
        "name: sim-test\nentrypoint: python train.py\n"
        f"resources: {{time: '{time}', gpus_per_node: {gpus}}}\n"
        "hyperparameters:\n"
        "  lr: {type: log, minval: -4, maxval: -1}\n"
        "  width: {type: int, minval: 16, maxval: 256}\n"
        "  act: {type: categorical, vals: [relu, tanh]}\n"
        f"searcher:\n{searcher}"
    )
    return path


def _load(path: Path) -> ExperimentConfig:
    return load_experiment(path, site="local", searchers=SearcherTable())


def _run(
    cfg: ExperimentConfig, home: Path | None = None, epoch_s: float = 120.0, **kw: Any
) -> RunResult:
    settings = SimSettings(**{"gpus": 4, "queue_wait_s": 30.0, "tick_interval_s": 120.0, **kw})
    src = SyntheticCurves(
        cfg.hyperparameters, cfg.searcher.max_length, cfg.searcher.smaller_is_better, epoch_s
    )
    ref = best_reference(
        src, cfg.hyperparameters, cfg.searcher.max_length, cfg.searcher.smaller_is_better
    )
    return simulate_once(cfg, src, settings, ref, home=home)


RANDOM = (
    "  name: random\n  metric: acc\n  smaller_is_better: false\n  max_trials: 6\n  max_length: 4\n"
)
ASHA = (
    "  name: asha\n  metric: loss\n  smaller_is_better: true\n  max_trials: 9\n"
    "  max_length: 9\n  divisor: 3\n  max_concurrent_trials: 3\n"
)


def test_virtual_clock_moves_only_forward() -> None:
    clock = VirtualClock()
    assert clock.time() == SIM_EPOCH and clock.now().year == 2030
    clock.advance(90)
    assert clock.elapsed() == 90
    with pytest.raises(ValueError):
        clock.advance_to(SIM_EPOCH)


def test_synthetic_family_is_deterministic_with_a_known_best_and_crossing_curves() -> None:
    cfg = _load(DIGITS / "random.yaml")
    space, length = cfg.hyperparameters, 27
    a = SyntheticCurves(space, length, False, 10.0, seed=3)
    b = SyntheticCurves(space, length, False, 10.0, seed=3)
    best = a.best_config()
    assert a.true_final(best, length) == b.true_final(best, length)
    ref = best_reference(a, space, length, False, top=0.05)
    assert ref.is_best(a.true_final(best, length))
    assert ref.optimum == pytest.approx(a.true_final(best, length))
    assert a.curve(best, 7).value(5) == b.curve(best, 7).value(5)  # noise is seeded
    # some configuration leads the best one early and ends behind it: curves cross
    import random

    rng = random.Random(0)
    from dlhpc.search import sample

    crossing = False
    for _ in range(300):
        hp = {n: sample(space[n], rng) for n in space}
        early = a.true_final(hp, 1) > a.true_final(best, 1)
        late = a.true_final(hp, length) < a.true_final(best, length)
        crossing = crossing or (early and late)
    assert crossing


def _without_time(r: RunResult) -> dict[str, Any]:
    d = dataclasses.asdict(r)
    d.pop("real_s")
    return d


@pytest.fixture(scope="module")
def random_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[ExperimentConfig, Path, RunResult]:
    """One simulated random search, its state folder kept (shared by several tests)."""
    tmp = tmp_path_factory.mktemp("random")
    cfg = _load(_yaml(tmp, RANDOM))
    return cfg, tmp / "run" / "home", _run(cfg, home=tmp / "run")


def test_a_run_is_deterministic_and_completes_trials_in_the_real_db(
    random_run: tuple[ExperimentConfig, Path, RunResult],
) -> None:
    cfg, home, first = random_run
    assert _without_time(first) == _without_time(_run(cfg))
    assert first.state == "COMPLETED" and first.completed == first.trials == 6
    store = Store(home)
    with store.read() as s:
        exp = s.scalars(select(Experiment)).one()
        assert exp.backend == "sim" and exp.state == "COMPLETED"
        trials = s.scalars(select(Trial)).all()
        assert {t.state for t in trials} == {"COMPLETED"}
        assert all(t.steps_completed == 4 for t in trials)
        times = s.scalars(select(Metric.time)).all()
        assert len(times) == 6 * 4 and min(times) > SIM_EPOCH  # virtual, not wall-clock
        attempts = s.scalars(select(Attempt)).all()
        gpu_s = sum((a.ended_at - a.started_at).total_seconds() for a in attempts)  # type: ignore[operator]
    store.close()
    assert gpu_s / 3600 == pytest.approx(first.gpu_hours, rel=1e-6)
    assert first.best_true is not None and first.best_metric is not None


def test_asha_pauses_promotes_and_stops_through_the_orchestrator(tmp_path: Path) -> None:
    cfg = _load(_yaml(tmp_path, ASHA))
    result = _run(cfg, home=tmp_path / "run", epoch_s=60.0)
    assert result.state == "COMPLETED"
    assert result.promotions > 0 and result.stops > 0 and result.completed >= 1
    assert result.attempt_causes.get("paused", 0) > 0
    store = Store(tmp_path / "run" / "home")
    with store.read() as s:
        kinds = set(s.scalars(select(Decision.kind)))
        lengths = {t.max_length for t in s.scalars(select(Trial))}
    store.close()
    assert kinds == {"promote", "stop"}
    assert lengths == {1, 3, 9}  # the rungs
    # its recorded curves keep every trial, the stopped ones too, each with its own steps,
    # so that simulating it again replays it (not every config on the few completed curves)
    store = Store(tmp_path / "run" / "home")
    try:
        curves = load_recorded(store, 1, "loss", cfg.hyperparameters)
        with store.read() as s:
            trials = s.scalars(select(Trial)).all()
            mine = [(json.loads(t.hparams_json), t.steps_completed) for t in trials]
    finally:
        store.close()
    assert len(curves.trials) == result.trials == len(mine)
    assert all(len(curves.nearest(hp).values) == steps for hp, steps in mine)


def test_running_trials_stopped_by_the_searcher_exit_through_the_stop_file(
    tmp_path: Path,
) -> None:
    cfg = _load(_yaml(tmp_path, ASHA + "  stop_once: true\n"))
    result = _run(cfg, home=tmp_path / "run", epoch_s=60.0)
    assert result.state == "COMPLETED" and result.stops > 0 and result.promotions == 0
    assert result.attempt_causes.get("stopped") == result.stops
    store = Store(tmp_path / "run" / "home")
    with store.read() as s:
        stopped = s.scalars(select(Trial).where(Trial.state == "STOPPED_EARLY")).all()
        assert len(stopped) == result.stops
        for t in stopped:
            last = t.attempts[-1]
            assert (Path(t.run_dir) / STOP_FILE).exists()
            # exited 75 on its own (no signal), not cancelled after the grace time
            assert (last.exit_code, last.exit_reason) == (75, "requeue")
            assert 0 < t.steps_completed < 9
    store.close()


def test_preempted_attempts_are_resubmitted_and_trials_still_complete(tmp_path: Path) -> None:
    cfg = _load(_yaml(tmp_path, RANDOM))
    result = _run(cfg, epoch_s=900.0, preempt_rate=2.0, tick_interval_s=300.0)
    assert result.state == "COMPLETED" and result.completed == 6
    assert result.preemptions > 0 and result.wasted_gpu_hours > 0
    assert result.attempt_causes.get("preempted", 0) == result.preemptions


def test_time_limit_requeues_the_task_as_a_new_attempt(tmp_path: Path) -> None:
    cfg = _load(_yaml(tmp_path, RANDOM, time="00:12:00"))  # 10 min after the lead time
    result = _run(cfg, epoch_s=200.0, gpus=8)  # 4 epochs x 200 s + startup > 10 min
    assert result.state == "COMPLETED" and result.completed == 6
    assert result.timeouts >= 6 and result.attempt_causes.get("timeout", 0) == result.timeouts


def _request(tmp_path: Path, n: int) -> JobRequest:
    dirs = []
    for i in range(n):
        d = tmp_path / f"trial-{i}"
        d.mkdir()
        TrialSpec(1, i + 1, {"x": 0.5}, 3, i, "", "", "", "", "m", False).write(d / "trial.json")
        dirs.append(d)
    return JobRequest(
        1,
        "sim-test",
        tmp_path / "jobs",
        dirs,
        Resources(gpus_per_node=2),
        PreemptionConfig(),
        SiteConfig("t", None),
    )


def test_cluster_honours_the_stop_file_slots_and_cancel(tmp_path: Path) -> None:
    clock = VirtualClock()
    space = _load(DIGITS / "random.yaml").hyperparameters
    curves = SyntheticCurves(space, 3, False, 100.0)
    cluster = SimCluster(clock, curves, ClusterSpec(gpus=4, queue_wait_s=0, startup_s=10))
    tasks = cluster.submit(_request(tmp_path, 3))
    clock.advance(150)  # startup + the first epoch of the two tasks that fit
    st = cluster.poll([t.job_id for t in tasks])
    assert [s.state for s in st.values()] == [JobState.RUNNING, JobState.RUNNING, JobState.PENDING]
    (tasks[0].trial_dir / STOP_FILE).write_text("{}")
    cluster.advance_to(clock.time() + 1)  # noticed within STOP_NOTICE_S
    clock.advance(60)
    cluster.cancel([tasks[1].job_id])
    st = cluster.poll([t.job_id for t in tasks])
    assert st[tasks[0].job_id].state == JobState.FAILED  # exited 75 on its own
    assert st[tasks[1].job_id].state == JobState.CANCELLED
    assert st[tasks[2].job_id].state == JobState.RUNNING  # got the freed GPUs
    exits = {}
    for t in tasks[:2]:
        adir = t.trial_dir / "attempts" / f"{t.job_id}.r0"
        records = [r for b in read_event_batches(adir) for r in b.records]
        exits[t.job_id] = records[-1]
        assert records[0]["type"] == "start" and records[0]["time"] >= SIM_EPOCH
        assert [r["step"] for r in records if r["type"] == "metric"] == [1]
    assert exits[tasks[0].job_id]["code"] == 75 and exits[tasks[0].job_id]["signal"] is None
    assert exits[tasks[1].job_id]["signal"] == "TERM"
    assert cluster.stats.stops == 1 and cluster.stats.cancels == 1


def test_recorded_curves_come_from_a_finished_experiment(
    random_run: tuple[ExperimentConfig, Path, RunResult],
) -> None:
    cfg, home, _ = random_run
    store = Store(home)
    curves = load_recorded(store, 1, "acc", cfg.hyperparameters)
    with store.read() as s:
        t = s.scalars(select(Trial).order_by(Trial.id)).first()
        assert t is not None
        hp, final = json.loads(t.hparams_json), t.latest_metric
    store.close()
    assert len(curves.trials) == 6
    assert curves.true_final(hp, 4) == final
    # the run's 30 s start-up is measured and taken off each attempt's first epoch
    # (the simulated cluster adds it again), so every epoch is the curve's own ~120 s
    assert curves.startup_s == pytest.approx(30.0, abs=5.0)
    for t in curves.trials:  # epochs of one config differ by their 3 % jitter only
        assert len(t.seconds) == 4 and abs(t.seconds[0] - statistics.median(t.seconds[1:])) < 10


def test_teardown_lengthens_each_attempt_and_is_measured_from_the_records(
    tmp_path: Path, random_run: tuple[ExperimentConfig, Path, RunResult]
) -> None:
    cfg, home, plain = random_run
    slow = _run(cfg, home=tmp_path / "run", teardown_s=7.0)
    # the same 6 one-attempt trials, each job 7 s longer (its last checkpoint and exit)
    assert (slow.trials, slow.epochs) == (plain.trials, plain.epochs) == (6, 24)
    assert slow.gpu_hours - plain.gpu_hours == pytest.approx(6 * 7.0 / 3600)
    store = Store(tmp_path / "run" / "home")
    try:
        curves = load_recorded(store, 1, "acc", cfg.hyperparameters)
    finally:
        store.close()
    assert curves.teardown_s == pytest.approx(7.0, abs=0.01)
    store = Store(home)
    try:
        assert load_recorded(store, 1, "acc", cfg.hyperparameters).teardown_s < 0.01
    finally:
        store.close()


def _cli(*args: str) -> Any:
    return CliRunner().invoke(cli, ["simulate", *args], catch_exceptions=False)


def test_cli_json_on_the_digits_grid(home: Path) -> None:
    res = _cli(
        str(DIGITS / "grid.yaml"), "--site", "local", "--reps", "1", "--alternatives", "random",
        "--json", "--tick-interval", "120",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert [s["searcher"] for s in data["searchers"]] == ["grid", "random"]
    grid = data["searchers"][0]
    assert grid["runs"][0]["state"] == "COMPLETED" and grid["runs"][0]["trials"] == 4
    assert grid["median_gpu_hours"] > 0 and 0 <= grid["p_best"] <= 1


def test_cli_skips_grid_without_counts_and_reads_recorded_curves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, random_run: tuple[Any, Path, RunResult]
) -> None:
    exp = str(_yaml(tmp_path, RANDOM))
    args = ["--site", "local", "--reps", "1", "--alternatives", "grid", "--json"]
    monkeypatch.setenv("DLHPC_HOME", str(tmp_path / "empty"))
    assert _cli(exp, *args, "--curves", "experiment:1").exit_code == 2  # no DB there
    monkeypatch.setenv("DLHPC_HOME", str(random_run[1]))
    res = _cli(exp, *args, "--curves", "experiment:1", "--tick-interval", "120")
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert "count" in data["skipped"]["grid"] and data["curves"].startswith("recorded")
    assert data["searchers"][0]["runs"][0]["state"] == "COMPLETED"


@pytest.mark.parametrize(
    "args",
    [["--gpus", "0"], ["--curves", "bogus"], ["--alternatives", "nope"], ["--top", "1"]],
)
def test_cli_bad_input_exits_2(args: list[str], home: Path) -> None:
    res = CliRunner().invoke(cli, ["simulate", str(DIGITS / "grid.yaml"), "--site", "local", *args])
    assert res.exit_code == 2, res.output


def test_simulated_checkpoints_point_under_the_root_and_the_gc_keeps_the_policys_few(
    tmp_path: Path,
) -> None:
    """Each simulated epoch's checkpoint record names ``<checkpoint_dir>/ckpt-<step>``
    (never made), so the tick's GC marks the ones its policy drops as deleted, as in a
    real run, instead of refusing them forever (the cost of every later GC pass)."""
    cfg = _load(_yaml(tmp_path, ASHA))
    result = _run(cfg, home=tmp_path / "run", epoch_s=60.0)
    assert result.state == "COMPLETED"
    store = Store(tmp_path / "run" / "home")
    try:
        with store.read() as s:
            rows = s.execute(select(Checkpoint.trial_id, Checkpoint.path, Checkpoint.state)).all()
            trial_dirs = {
                t.id: TrialSpec.read(Path(t.run_dir) / "trial.json").checkpoint_dir
                for t in s.scalars(select(Trial))
            }
    finally:
        store.close()
    assert len(rows) == result.epochs
    assert all(Path(p).parent == Path(trial_dirs[tid]) for tid, p, _ in rows)
    active: dict[int, int] = {}
    for tid, _, state in rows:
        active[tid] = active.get(tid, 0) + (state == "ACTIVE")
    # keep_best 1 and keep_latest 1: at most two per trial stay, the rest are marked deleted
    assert max(active.values()) <= 2 and sum(active.values()) < len(rows)
