"""scripts/bench/lcbench: the LCBench surrogate wrapper, the measures on a tiny
fake curve set, the worker simulation, and a smoke run of the driver (the benchmark
itself is not run here)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts" / "bench" / "lcbench"
sys.path.insert(0, str(SCRIPTS))

from _lcbench_measures import Trace, checkpoints, median_inf, ratio  # noqa: E402
from _lcbench_peers import TopK, run_workers  # noqa: E402
from _lcbench_surrogate import (  # noqa: E402
    INPUTS,
    MAX_LENGTH,
    Curve,
    TaskReference,
    config_row,
    data_dir,
)

# QUERYING.md's example configuration, in its column order after `epoch`
EXAMPLE = {
    "batch_size": 64,
    "learning_rate": 0.01,
    "momentum": 0.9,
    "weight_decay": 1e-4,
    "num_layers": 2,
    "max_units": 512,
    "max_dropout": 0.1,
}


def _require_surrogate() -> Any:
    """A Surrogate. Without onnxruntime (a dev dependency): skip, but fail under CI. Without
    the surrogate's data (outside the repository: ``../shared/benchmarks/yahpo-lcbench`` or
    ``$DLHPC_LCBENCH_DIR``): skip, saying where it was looked for."""
    if importlib.util.find_spec("onnxruntime") is None:
        problem = "the LCBench benchmark needs onnxruntime (pip install 'dlhpc[bench]')"
        if os.environ.get("CI"):
            pytest.fail(problem)
        pytest.skip(problem)
    try:
        data_dir()
    except FileNotFoundError as exc:
        pytest.skip(f"the LCBench surrogate's data is not on this machine: {exc}")
    from _lcbench_surrogate import Surrogate

    return Surrogate()


# -- the surrogate wrapper ------------------------------------------------------------


def test_config_row_is_querying_md_column_order_with_integers_rounded() -> None:
    assert INPUTS == (
        "epoch", "batch_size", "learning_rate", "momentum",
        "weight_decay", "num_layers", "max_units", "max_dropout",
    )  # fmt: skip
    hp = {**EXAMPLE, "batch_size": 63.6, "max_units": 511.5, "num_layers": 2.4}
    assert config_row(hp) == [64.0, 0.01, 0.9, 1e-4, 2.0, 512.0, 0.1]


def test_surrogate_shapes_types_and_known_value() -> None:
    s = _require_surrogate()
    assert len(s.tasks) == 34 and "167083" not in s.tasks and "#na#" not in s.tasks
    assert s.codes["3945"] == 34 and s.codes["7593"] == 35  # QUERYING.md's codes
    inputs = {i.name: (i.type, i.shape[1]) for i in s.session.get_inputs()}
    assert inputs == {"x_cat": ("tensor(int32)", 1), "x_cont": ("tensor(float)", 8)}
    out = s.raw("3945", [config_row(EXAMPLE)] * 2, range(1, 53))
    assert out.shape == (104, 6) and str(out.dtype) == "float32"
    # surrogate epoch 2 (budget epoch 1) and 51 (budget epoch 50) of QUERYING.md's example
    assert out[1, 1] == pytest.approx(85.1623, abs=1e-3)
    assert out[50, 1] == pytest.approx(91.5099, abs=1e-3)
    curve = s.curve("3945", EXAMPLE)
    assert len(curve.values) == len(curve.seconds) == MAX_LENGTH
    assert curve.values[0] == pytest.approx(float(out[1, 1]))
    assert curve.final == pytest.approx(float(out[50, 1]))
    assert curve.seconds[0] == pytest.approx(float(out[1, 0] - out[0, 0]), rel=1e-5)
    assert all(x > 0 for x in curve.seconds)


def test_surrogate_is_deterministic_and_rejects_unknown_tasks() -> None:
    s = _require_surrogate()
    from _lcbench_surrogate import Surrogate, random_configs, reference

    configs = random_configs(5, "t")
    first = s.curves("167184", configs)
    again = Surrogate().curves("167184", list(reversed(configs)))
    assert first == list(reversed(again))
    with pytest.raises(ValueError, match="unknown LCBench task"):
        s.curve("12345", EXAMPLE)
    ref = reference(s, "167184", samples=50)
    assert ref == reference(Surrogate(), "167184", samples=50)
    assert ref.target == pytest.approx(ref.best - 1.0)
    assert ref.lo < ref.best <= ref.hi and 0 < ref.share <= 1


# -- the measures on a tiny fake curve set ----------------------------------------------


def test_trace_compute_to_target_and_budget() -> None:
    t = Trace(budget=4)
    assert not t.add(10.0, 2.0, 50.0)
    assert not t.add(12.0, 3.0, 70.0)
    assert not t.add(12.0, 1.0, 60.0)
    assert t.add(20.0, 4.0, 80.0)  # the budget is spent with this one
    assert t.add(30.0, 9.0, 99.0) and t.epochs == 4  # beyond the budget: dropped
    assert t.to_target(65.0) == {"epochs": 2, "gpu_hours": 5.0 / 3600, "wall_hours": 12 / 3600}
    assert t.to_target(80.0) == {"epochs": 4, "gpu_hours": 10 / 3600, "wall_hours": 20 / 3600}
    assert t.to_target(81.0) is None
    back = Trace(3)
    back.add(5.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="time order"):
        back.add(4.0, 1.0, 1.0)


def test_regret_is_normalised_from_the_best_so_far() -> None:
    ref = TaskReference("t", 90.0, 89.0, 0.0, 100.0, 0.1, 10, random_epochs=500, random_gpu_hours=1)
    t = Trace(budget=10)
    for wall, value in enumerate([50.0, 80.0, 60.0, 95.0]):
        t.add(float(wall), 1.0, value)
    assert t.regret_at([0, 1, 3, 4, 10], ref.regret) == pytest.approx([1.0, 0.5, 0.2, 0.05, 0.05])


def test_checkpoints_medians_and_ratios() -> None:
    marks = checkpoints(10_000, 50, points=5)
    assert marks[0] == 50 and marks[-1] == 10_000 and marks == sorted(marks) and len(marks) == 5
    assert checkpoints(40, 50) == [40]
    assert median_inf([1, None, None]) == math.inf and median_inf([1, 3, None]) == 3
    assert ratio(100, 1000, 5000) == 0.1
    assert ratio(100, math.inf, 5000) == 0.02  # random beyond the budget: an upper bound
    assert ratio(math.inf, 1000, 5000) == math.inf


class _FakeSurrogate:
    """Curves by learning rate: value = lr * 100 + epoch / 100; every epoch takes 1 s."""

    def curve(self, task: str, hp: dict[str, Any]) -> Curve:
        v = float(hp["learning_rate"]) * 100
        return Curve(tuple(v + e / 100 for e in range(1, 51)), (1.0,) * 50)


def test_topk_screens_one_epoch_each_then_trains_the_best_on() -> None:
    budget = 2 * 49 + 100  # 99 screening epochs, then k = 2 full trainings
    method = TopK(seed=0, budget=budget)
    assert (method.n, method.k) == (99, 2)
    best = max(range(method.n), key=lambda i: method.configs[i]["learning_rate"])
    fake: Any = _FakeSurrogate()
    trace, facts = run_workers(method, fake, "t", workers=4, budget=budget, scale=1.0)
    assert facts["starts"] == 99 + 2 and trace.epochs == 99 + 2 * 49
    target = method.configs[best]["learning_rate"] * 100 + 0.5
    hit = trace.to_target(target)
    assert hit is not None and hit["epochs"] > 99  # only after the screening
    assert trace.best() == pytest.approx(target)


# -- the driver -------------------------------------------------------------------------


def test_driver_smoke_random_and_asha(tmp_path: Path) -> None:
    _require_surrogate()
    import bench_search_lcbench as bench

    out = tmp_path / "r.json"
    args = ["--tasks", "167184", "--seeds", "1", "--workers", "4", "--budget", "300"]
    args += ["--methods", "random,asha", "--reference-samples", "200", "--json", str(out)]
    args += ["--svg-dir", str(tmp_path / "svg"), "--searcher", "bad={name: asha, nokey: 1}"]
    assert bench.main(args) == 0
    result = json.loads(out.read_text())
    assert [r["method"] for r in result["runs"]] == ["random", "asha"]
    assert "nokey" in result["skipped"]["bad"]  # the searcher's own rules refuse it
    for run in result["runs"]:
        end = run["facts"]["end"]  # asha's natural max_trials may end it a little earlier
        assert (run["epochs"] == 300) == (end == "budget"), run["facts"]
        assert end == "budget" or (end == "searcher done before the budget" and run["epochs"] > 200)
        assert len(run["regret"]) == len(result["checkpoints"])
        assert all(0 <= r <= 1 for r in run["regret"])
        assert run["regret"] == sorted(run["regret"], reverse=True)
        assert 0 < run["cpu_s"] < 10 * run["real_s"] + 1
    asha = result["runs"][1]
    assert asha["facts"]["searcher"]["name"] == "asha"
    assert asha["facts"]["starts"] > result["runs"][0]["facts"]["starts"]
    assert asha["facts"]["max_trials"] > result["runs"][0]["facts"]["max_trials"] == 6 + 4
    assert (tmp_path / "svg" / "lcbench-regret-w4.svg").read_text().startswith("<svg")
    assert result["tasks_done"] == ["167184"]
    assert bench.main(["--report", str(out)]) == 0
    # a task not finished is left out of the report unless --partial-tasks
    partial = {**result, "tasks_done": []}
    assert bench.done_tasks_only(partial)["runs"] == []
    assert bench.done_tasks_only(result)["runs"] == result["runs"]
    # --resume goes on with a stopped run: the runs it has are kept, the others run
    out.write_text(json.dumps({**result, "runs": result["runs"][:1], "tasks_done": []}))
    assert bench.main([*args, "--resume"]) == 0
    again = json.loads(out.read_text())
    assert again["runs"][0] == result["runs"][0]  # kept as it was, not run again
    assert [r["method"] for r in again["runs"]] == ["random", "asha"]
    assert again["runs"][1]["to_target"] == asha["to_target"]
    assert again["tasks_done"] == ["167184"]
    with pytest.raises(SystemExit, match="other settings: \\['budget'\\]"):
        bench.main([*args[:7], "301", *args[8:], "--resume"])


def _fake_run(
    method: str, task: str, seed: int, epochs: int | None, regret: tuple[float, float]
) -> dict[str, Any]:
    hit = None if epochs is None else {"epochs": epochs, "gpu_hours": 1.0, "wall_hours": 2.0}
    return {
        "method": method, "task": task, "seed": seed, "workers": 4, "to_target": hit,
        "regret": list(regret), "regret_at": {"300": regret[0]}, "real_s": 1.0, "cpu_s": 2.0,
    }  # fmt: skip


def test_report_table_ratios_and_shard_merge() -> None:
    from _lcbench_report import merge, table, verdicts

    def result(task: str, random: list[int | None], asha: list[int | None]) -> dict[str, Any]:
        runs = [_fake_run("random", task, s, e, (0.5, 0.2)) for s, e in enumerate(random)]
        runs += [_fake_run("asha", task, s, e, (0.5, 0.1)) for s, e in enumerate(asha)]
        runs += [_fake_run("syne-asha", task, s, 400, (0.6, 0.05)) for s in range(3)]
        args = {"budget": 1000, "reference_samples": 2000, "points": 1.0}
        refs = {task: {"random_epochs": {"a": 200.0, "b": 5000.0}[task]}}
        return {"args": args, "checkpoints": [50, 1000], "runs": runs, "references": refs}

    shards = [result("a", [100, 200, 300], [10, 20, None]), result("b", [None] * 3, [100] * 3)]
    merged = merge(shards)
    text = table(merged, 4)
    # ratios to random's expected epochs (a 200, b 5000, beyond the budget but exact):
    # asha's per-task medians a=20, b=100: ratios 0.1 and 0.02; medians over tasks: asha 60
    assert "| asha | 5/6 | 60 | 0.06 | 1 | 2 | 0.1000 | 0.5000 | 1.0 | 2.0 |" in text
    assert "| random | 3/6 | > budget | > budget |" in text  # 200/200 and inf
    assert "| syne-asha | 6/6 | 400 | 1.04 |" in text  # 400/200 and 400/5000
    (line,) = verdicts(merged, 4)
    assert line.startswith("W=4 asha: median epochs to target 60 (random's expectation 2600)")
    assert "best peer syne-asha 400" in line and "every peer's at 1/2 checkpoints" in line
    # a side-by-side on a subset: task a only; W = 4 keeps all, W = 16 none
    from bench_search_lcbench import subset

    only_a = subset(merged, "a", "4,64")
    assert {r["task"] for r in only_a["runs"]} == {"a"} and len(only_a["runs"]) == 9
    assert subset(merged, "all", "16")["runs"] == [] and merged["runs"]
    assert subset(merged, "all", None)["runs"] == merged["runs"]  # no --workers: every W


def test_sim_cost_same_trace_in_every_scratch_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _require_surrogate()
    import lcbench_sim_cost

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    args = ["--task", "167184", "--methods", "random", "--workers", "4", "--budget", "120"]
    assert lcbench_sim_cost.main([*args, "--scratch", f"{a},{b}"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == [f"random scratch={a}", f"random scratch={b}"]
    digests = {line.split("trace ")[1].split(",")[0] for line in lines}
    assert len(digests) == 1 and all("120 epochs" in line for line in lines)
    assert list(a.iterdir()) == list(b.iterdir()) == []


def test_shared_curves_change_no_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The benchmark keeps a seed's curves for all its W and methods; each run is the
    one it is alone (lcbench_sim_cost.py runs each with the curves cleared before)."""
    _require_surrogate()
    import bench_search_lcbench as bench
    import lcbench_sim_cost

    methods = "random,sha,asha,asha-tpe,hyperband,topk"  # no peer: CI has no bench extra
    out = tmp_path / "r.json"
    args = ["--tasks", "167184", "--seeds", "2", "--workers", "4", "--budget", "200"]
    more = ["--methods", methods, "--reference-samples", "50", "--json", str(out)]
    assert bench.main([*args, *more]) == 0
    runs = json.loads(out.read_text())["runs"]
    shared = {(r["method"], r["seed"]): r["digest"] for r in runs}
    assert len(shared) == 12 and runs[0]["method"] == "random" and runs[6]["seed"] == 1
    capsys.readouterr()
    assert lcbench_sim_cost.main([*args, "--methods", methods]) == 0
    alone = {}
    for line in capsys.readouterr().out.splitlines():
        label, seed = line.split(" task=")[0], int(line.split("seed=")[1].split(" ")[0])
        alone[(label, seed)] = line.split("trace ")[1].split(",")[0]
    assert alone == shared


def test_method_labels() -> None:
    import bench_search_lcbench as bench

    got = bench.parse_methods("sha,asha,asha-tpe,syne-bohb", ["x={name: sha, divisor: 2}"])
    assert got == [
        ("sha", {"name": "sha"}),
        ("asha", {"name": "asha", "proposer": "random"}),
        ("asha-tpe", {"name": "asha", "proposer": "tpe"}),
        ("syne-bohb", None),
        ("x", {"name": "sha", "divisor": 2}),
    ]
    assert "bayes" not in bench.DEFAULT_METHODS.split(",")
    with pytest.raises(SystemExit, match="expected LABEL"):
        bench.parse_methods("", ["x={divisor: 2}"])
