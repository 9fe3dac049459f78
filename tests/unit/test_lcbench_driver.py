"""scripts/bench/lcbench/_lcbench_driver.py: dlhpc's searchers on the ask/tell event
driver make the decisions of the product (``launch`` and ``tick`` on ``dlhpc
simulate``'s cluster), on a small synthetic curve table; the driver's own rules.

Each searcher is compared on every (task, seed) pair of ``RUNS``; with
``DLHPC_TEST_FEWER=1`` (``scripts/test-pythons`` sets it: the Pythons besides the
whole suite's) on ``FEWER_RUNS`` only, the pair in which every searcher makes each
kind of decision it can. The product's side is the cost: a real store and real ticks,
on a memory file system where the machine has one (as ``dlhpc simulate``'s own runs).
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts" / "bench" / "lcbench"
sys.path.insert(0, str(SCRIPTS))

from _lcbench_dlhpc import (  # noqa: E402
    SimKnobs,
    make_method,
    run_dlhpc,
    searcher_section,
    store_decisions,
)
from _lcbench_driver import AskTellResult, run_ask_tell  # noqa: E402
from _lcbench_surrogate import Curve, random_expectation  # noqa: E402

from dlhpc.store import Store  # noqa: E402


class _Table:
    """Synthetic curves per task ("1".."3"): the final value peaks at a task's own
    learning rate and falls with dropout; an epoch takes 3..31 s by batch size and epoch,
    so several epochs end within one 60 s tick and decisions are batched."""

    def curve(self, task: str, hp: dict[str, Any]) -> Curve:
        k = int(task)
        lr, drop, batch = (float(hp[n]) for n in ("learning_rate", "max_dropout", "batch_size"))
        final = 100 * (1 - abs(math.log10(lr) + 2.5 + 0.3 * k) / 3) - 20 * drop
        values = tuple(final * (1 - 0.9**e) + ((e * 7 + k) % 5) * 0.1 for e in range(1, 51))
        seconds = tuple(3.0 + 25 * (batch - 16) / 500 + (e % 3) * 1.7 + k for e in range(1, 51))
        return Curve(values, seconds)

    def clear(self) -> None:
        pass


CPS = {"create", "promote", "stop"}
SEARCHERS = [  # (id, searcher mapping, budget in epochs, the decision kinds it makes)
    ("random", {"name": "random"}, 40, {"create"}),
    ("grid", {"name": "grid"}, 40, {"create"}),
    ("sha", {"name": "sha"}, 40, CPS),
    ("asha", {"name": "asha"}, 40, CPS),
    ("asha-stop-once", {"name": "asha", "stop_once": True}, 40, {"create", "stop"}),
    ("hyperband", {"name": "hyperband"}, 40, CPS),
    ("asha-tpe", {"name": "asha", "proposer": "tpe"}, 40, CPS),
    ("hyperband-tpe", {"name": "hyperband", "proposer": "tpe"}, 40, CPS),
    ("bayes", {"name": "bayes"}, 40, {"create"}),
]
WORKERS = 3
RUNS = [(task, seed) for task in ("1", "2", "3") for seed in (0, 1)]
FEWER_RUNS = [("2", 1)]


def _canonical(result: AskTellResult) -> list[tuple[float, str, int, Any]]:
    """The driver's decisions as :func:`store_decisions` gives the product's (a created
    trial by its hyperparameters: the store keeps no first grant; the epochs each trial
    trained are compared through the traces and the lengths told)."""
    out = [
        (at, kind, rid, result.digest.hparams[rid] if kind == "create" else length)
        for at, kind, rid, length in result.digest.decisions
    ]
    return sorted(out, key=lambda d: (d[0], d[1], d[2]))


def _both(section: dict[str, Any], task: str, seed: int, budget: int, scratch: Path) -> Any:
    """(product decisions, lengths told, trace; the driver's result) of one run."""
    full = searcher_section({**section, "seed": seed, "max_length": 9}, budget, WORKERS)
    got: dict[str, Any] = {}

    def inspect(store: Store, exp_id: int) -> None:
        got["decisions"], got["told"] = store_decisions(store, exp_id)

    table: Any = _Table()
    trace, _ = run_dlhpc(full, table, task, 0, budget, SimKnobs(WORKERS), scratch, inspect)
    searcher = make_method(full, budget, WORKERS)
    driven = run_ask_tell(searcher, lambda hp: table.curve(task, hp), WORKERS, budget, 60.0)
    product = [
        (at, kind, rid, json.loads(x) if kind == "create" else x)
        for at, kind, rid, x in got["decisions"]
    ]
    return product, got["told"], trace, driven


@pytest.fixture
def scratch(tmp_path: Path) -> Iterator[Path]:
    """The runs' folder: under /dev/shm when it is a folder all may write (no fsyncs, nothing
    measured changes: the clock is virtual), else ``tmp_path``."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and shm.stat().st_mode & 0o002):
        yield tmp_path
        return
    folder = Path(tempfile.mkdtemp(prefix="dlhpc-test-lcbench-", dir=shm))
    yield folder
    shutil.rmtree(folder)


@pytest.mark.parametrize(
    ("section", "budget", "kinds_made"), [s[1:] for s in SEARCHERS], ids=[s[0] for s in SEARCHERS]
)
def test_driver_decides_as_the_product(
    section: dict[str, Any], budget: int, kinds_made: set[str], scratch: Path, fewer: bool
) -> None:
    if section["name"] == "bayes":
        pytest.importorskip("skopt")  # an extra (dlhpc[bayes]), not on the other Pythons
    kinds: set[str] = set()
    for task, seed in FEWER_RUNS if fewer else RUNS:
        product, told, trace, driven = _both(section, task, seed, budget, scratch)
        assert product == _canonical(driven), (task, seed)
        assert told == driven.told, (task, seed)
        ours = sorted(zip(driven.trace.wall, driven.trace.values, strict=True))
        theirs = sorted(zip(trace.wall, trace.values, strict=True))
        assert [v for _, v in ours] == [v for _, v in theirs]
        assert [w for w, _ in ours] == pytest.approx([w for w, _ in theirs], abs=1e-6)
        kinds |= {d[1] for d in product}
    assert kinds == kinds_made  # the decisions compared include each kind it makes


class _Steady:
    """Every configuration: value = epoch, each epoch 10 s."""

    values = tuple(float(e) for e in range(1, 51))
    seconds = (10.0,) * 50


def _searcher(section: dict[str, Any], budget: int, workers: int) -> Any:
    full = searcher_section({**section, "seed": 0, "max_length": 9}, budget, workers)
    return make_method(full, budget, workers)


def test_decisions_wait_for_the_tick_or_follow_each_epoch() -> None:
    steady = _Steady()
    ticked = run_ask_tell(_searcher({"name": "random"}, 40, 2), lambda hp: steady, 2, 40, 60.0)
    # two trials of 9 epochs (90 s) at a time; the next start at the tick after 90 s
    creates = [d[0] for d in ticked.digest.decisions if d[1] == "create"]
    assert creates[:4] == [0.0, 0.0, 120.0, 120.0]
    assert ticked.trace.epochs == 40 and ticked.end == "budget"
    at_once = run_ask_tell(_searcher({"name": "random"}, 40, 2), lambda hp: steady, 2, 40, 0.0)
    assert [d[0] for d in at_once.digest.decisions][:4] == [0.0, 0.0, 90.0, 90.0]
    assert at_once.trace.wall[-1] < ticked.trace.wall[-1]


def test_a_stop_ends_the_job_after_the_notice() -> None:
    steady = _Steady()
    run = run_ask_tell(
        _searcher({"name": "asha", "stop_once": True}, 200, 3), lambda hp: steady, 3, 200, 60.0
    )
    stops = [d for d in run.digest.decisions if d[1] == "stop"]
    assert stops and all(d[0] % 60 == 0 for d in stops)  # decided at ticks
    # a stopped trial trains the epochs that end within the notice, then nothing more
    for _, _, rid, told in stops:
        assert run.told[rid] >= told
        assert run.told[rid] <= told + 6  # at most 60 s of epochs were told late


def test_random_expectation_is_exact_on_a_small_pool() -> None:
    hit_late = Curve((1.0, 2.0, 5.0), (1.0, 2.0, 3.0))  # reaches 5 at epoch 3: 3 epochs, 6 s
    hit_early = Curve((5.0, 5.0, 5.0), (4.0, 4.0, 4.0))  # at epoch 1: 1 epoch, 4 s
    miss = Curve((1.0, 1.0, 1.0), (2.0, 2.0, 2.0))  # 3 epochs, 6 s
    # p = 2/3: 0.5 misses on average (3 epochs, 6 s each), then a hit of mean 2 epochs, 5 s
    assert random_expectation([hit_late, hit_early, miss], 5.0) == pytest.approx((3.5, 8.0))
    assert random_expectation([hit_early], 5.0) == (1.0, 4.0)
    with pytest.raises(ValueError, match="no curve reaches"):
        random_expectation([miss], 5.0)
