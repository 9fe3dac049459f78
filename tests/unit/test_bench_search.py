"""Smoke test of scripts/bench/search/bench_search.py with tiny budgets (the benchmark
itself is not run)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("torch")
pytest.importorskip("sklearn")

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts" / "bench" / "search"


def _load(name: str) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


TINY = [
    "--seeds",
    "1",
    "--workers",
    "2",
    "--max-length",
    "3",
    "--budget",
    "2",
    "--calib-configs",
    "3",
]
HP = {"batch_size": 128, "dropout": 0.2, "hidden": 16, "lr": 0.01, "weight_decay": 1e-5}


def _run(tmp_path: Path, methods: str) -> dict:  # type: ignore[type-arg]
    bench = _load("bench_search")
    out = tmp_path / "out.json"
    args = [*TINY, "--methods", methods, "--cache", str(tmp_path / "c.json"), "--json", str(out)]
    assert bench.main(args) == 0
    record = json.loads(out.read_text())
    assert record["date_utc"] and record["machine"]["cpus"]  # scripts/bench/_result.py's record
    return record["result"]  # type: ignore[no-any-return]


def test_random_driver_spends_the_budget_and_reruns_identically(tmp_path: Path) -> None:
    first = _run(tmp_path, "random")
    assert first["skipped"] == {}
    (run,) = first["runs"]
    assert run["method"] == "random" and run["epochs"] == 2 * 3  # the budget, in trial-epochs
    assert run["trials"] == 2  # 2 slots: two full trainings spend it
    assert 0.0 < run["best"] <= 1.0
    assert 0.0 < first["calibration"]["target"] <= 1.0
    if run["epochs_to_target"] is not None:
        assert 1 <= run["epochs_to_target"] <= run["epochs"]
    assert (tmp_path / "c.json").exists()
    second = _run(tmp_path, "random")  # from the cache: same curves, same charges
    assert second["runs"] == first["runs"]


def test_paused_and_interleaved_training_gives_the_straight_curve() -> None:
    digits = _load("_bench_search_digits")
    straight = digits.CurveCache(None)
    curve = [straight.point(HP, 3, e)[0] for e in (1, 2, 3)]
    other = {**HP, "hidden": 32}
    mixed = digits.CurveCache(None)
    got = [mixed.point(HP, 3, 1)[0], mixed.point(other, 3, 1)[0]]
    mixed.release(HP, 3)  # paused and evicted: the prefix is replayed from scratch
    got += [mixed.point(HP, 3, 2)[0], mixed.point(other, 3, 2)[0], mixed.point(HP, 3, 3)[0]]
    assert [got[0], got[2], got[4]] == curve
    assert mixed.replay_mismatches == 0


def test_optuna_driver(tmp_path: Path) -> None:
    pytest.importorskip("optuna")
    result = _run(tmp_path, "optuna-sha-random,optuna-hb-tpe")
    assert result["skipped"] == {}
    assert [r["method"] for r in result["runs"]] == ["optuna-sha-random", "optuna-hb-tpe"]
    assert all(r["epochs"] == 6 and r["trials"] >= 2 for r in result["runs"])
