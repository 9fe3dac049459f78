"""The peer methods of ``bench_search_lcbench.py`` on the same virtual-worker model.

:func:`run_workers` simulates ``workers`` GPUs on a virtual clock: each free worker asks
the method for a trial (a configuration and the epoch it starts from), trains it epoch
after epoch (each taking the surrogate's seconds), and after every epoch tells the method
the value and asks whether to go on; a trial told to stop (or at 50 epochs) frees its
worker at once. Decisions are instant (in-process tools), there is no queue wait or
start-up time. Every trained epoch is recorded in the run's :class:`Trace`; the run ends
when the budget is spent, or when nothing runs and the method starts nothing.

Methods (:data:`PEERS`): Optuna's ask/tell with a pruner (``optuna-tpe-hb``,
``optuna-tpe-sha``, ``optuna-random-median``), Syne Tune's schedulers (``syne-asha``,
``syne-bohb``), and ``topk``, the one-epoch baseline of Egele et al. (2023): train
``n`` random configurations one epoch each, then the ``k`` best on to 50 epochs (its
split of the budget: :class:`TopK`). Optuna and Syne Tune are imported when their
method runs (benchmark-only dependencies).
"""

from __future__ import annotations

import heapq
import logging
import warnings
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
from _lcbench_measures import Trace
from _lcbench_surrogate import MAX_LENGTH, Surrogate, random_configs

# (name, lower, upper, kind) of LCBench's space in natural units (config_space.json)
BOUNDS = (
    ("batch_size", 16, 512, "logint"),
    ("learning_rate", 1e-4, 1e-1, "log"),
    ("momentum", 0.1, 0.99, "float"),
    ("weight_decay", 1e-5, 0.1, "float"),
    ("num_layers", 1, 5, "int"),
    ("max_units", 64, 1024, "logint"),
    ("max_dropout", 0.0, 1.0, "float"),
)


class Method(Protocol):
    """A method in the worker simulation (trial handles are the method's own)."""

    def new(self) -> tuple[Any, dict[str, Any], int] | None:
        """A trial to start now: (handle, configuration, epochs already trained); None:
        nothing to start now."""

    def report(self, handle: Any, epoch: int, value: float) -> bool:
        """The trial's ``epoch`` ended with ``value``; True: train the next epoch."""


def run_workers(
    method: Method, surrogate: Surrogate, task: str, workers: int, budget: int, scale: float
) -> tuple[Trace, dict[str, Any]]:
    """Simulate ``method`` with ``workers`` workers until ``budget`` epochs (module doc)."""
    trace = Trace(budget)
    running: list[tuple[float, int, Any, list[Any]]] = []  # (epoch end, seq, handle, state)
    now, seq, trials, idle = 0.0, 0, 0, workers
    while True:
        while idle > 0 and (got := method.new()) is not None:
            handle, hp, done = got
            curve = surrogate.curve(task, hp)
            heapq.heappush(running, (now + curve.seconds[done] * scale, seq, handle, [curve, done]))
            seq, trials, idle = seq + 1, trials + 1, idle - 1
        if not running:
            return trace, {"end": "method started nothing more", "starts": trials}
        now, _, handle, state = heapq.heappop(running)
        curve, done = state[0], state[1] + 1
        value = curve.values[done - 1]
        if trace.add(now, curve.seconds[done - 1] * scale, value):
            return trace, {"end": "budget", "starts": trials}
        if method.report(handle, done, value) and done < MAX_LENGTH:
            state[1] = done
            heapq.heappush(running, (now + curve.seconds[done] * scale, seq, handle, state))
            seq += 1
        else:
            idle += 1


class TopK:
    """Egele et al. (2023)'s one-epoch baseline: ``n`` random configurations train one
    epoch each; when all have, the ``k`` best (by that epoch) train on to 50 epochs, best
    first. ``n`` and ``k`` split the budget: ``screen`` of it to the first epochs, the rest
    to the ``k`` full trainings (``k >= 1``)."""

    def __init__(self, seed: int, budget: int, screen: float = 0.5) -> None:
        self.n = max(1, int(budget * screen))
        self.k = max(1, (budget - self.n) // (MAX_LENGTH - 1))
        self.configs = random_configs(self.n, f"topk:{seed}")
        self.issued = 0
        self.first: dict[int, float] = {}
        self.queue: list[int] | None = None

    def new(self) -> tuple[Any, dict[str, Any], int] | None:
        if self.issued < self.n:
            self.issued += 1
            return self.issued - 1, self.configs[self.issued - 1], 0
        if len(self.first) < self.n:
            return None  # wait for the screening epochs
        if self.queue is None:
            order = sorted(self.first, key=lambda i: (-self.first[i], i))
            self.queue = order[: self.k]
        if not self.queue:
            return None
        i = self.queue.pop(0)
        return i, self.configs[i], 1

    def report(self, handle: Any, epoch: int, value: float) -> bool:
        if epoch == 1 and self.queue is None:
            self.first[int(handle)] = value
            return False
        return True


class OptunaMethod:
    """An Optuna study (ask/tell, several trials at once) with a sampler and a pruner:
    ``tpe-hb`` (TPESampler + HyperbandPruner), ``tpe-sha`` (+ SuccessiveHalvingPruner),
    ``random-median`` (RandomSampler + MedianPruner); resources are epochs 1..50 and the
    reduction factor is 3, as dlhpc's defaults."""

    def __init__(self, variant: str, seed: int) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.optuna = optuna
        sampler_name, pruner_name = variant.split("-")
        sampler: Any = (
            optuna.samplers.TPESampler(seed=seed)
            if sampler_name == "tpe"
            else optuna.samplers.RandomSampler(seed=seed)
        )
        pruners: dict[str, Callable[[], Any]] = {
            "hb": lambda: optuna.pruners.HyperbandPruner(
                min_resource=1, max_resource=MAX_LENGTH, reduction_factor=3
            ),
            "sha": lambda: optuna.pruners.SuccessiveHalvingPruner(
                min_resource=1, reduction_factor=3
            ),
            "median": lambda: optuna.pruners.MedianPruner(),
        }
        self.study = optuna.create_study(
            study_name=f"lcbench-{variant}-{seed}",  # HyperbandPruner hashes the name
            direction="maximize",
            sampler=sampler,
            pruner=pruners[pruner_name](),
        )

    def new(self) -> tuple[Any, dict[str, Any], int] | None:
        trial = self.study.ask()
        hp: dict[str, Any] = {}
        for name, lo, hi, kind in BOUNDS:
            if kind in ("int", "logint"):
                hp[name] = trial.suggest_int(name, int(lo), int(hi), log=kind == "logint")
            else:
                hp[name] = trial.suggest_float(name, lo, hi, log=kind == "log")
        return trial, hp, 0

    def report(self, handle: Any, epoch: int, value: float) -> bool:
        handle.report(value, epoch)
        if epoch >= MAX_LENGTH:
            self.study.tell(handle, value)
            return False
        if handle.should_prune():
            self.study.tell(handle, state=self.optuna.trial.TrialState.PRUNED)
            return False
        return True


class SyneMethod:
    """A Syne Tune scheduler driven directly as its ``Tuner`` drives it (suggest,
    on_trial_add, on_trial_result, on_trial_remove): ``asha`` (ASHA) or ``bohb`` (BOHB:
    ASHA with a KDE proposer); grace period 1 epoch, reduction factor 3, max_t 50, one
    bracket (its defaults)."""

    def __init__(self, variant: str, seed: int) -> None:
        from datetime import datetime

        from syne_tune import config_space as cs
        from syne_tune.backend.trial_status import Trial
        from syne_tune.optimizer import baselines
        from syne_tune.optimizer.scheduler import SchedulerDecision

        logging.getLogger("syne_tune").setLevel(logging.ERROR)  # a warning per scheduler
        # statsmodels (BOHB's KDE) announces a future change of its default RNG on every fit
        warnings.filterwarnings("ignore", category=FutureWarning, message="After 0.17")
        np.random.seed(seed)  # on_trial_add draws its bracket from numpy's global RNG
        makers = {"float": cs.uniform, "log": cs.loguniform, "int": cs.randint}
        space: dict[str, Any] = {
            name: (cs.lograndint if kind == "logint" else makers[kind])(lo, hi)
            for name, lo, hi, kind in BOUNDS
        }
        cls = {"asha": baselines.ASHA, "bohb": baselines.BOHB}[variant]
        self.scheduler = cls(
            space, metric="val_accuracy", time_attr="epoch", max_t=MAX_LENGTH,
            do_minimize=False, random_seed=seed,
        )  # fmt: skip
        self._trial, self._stop, self._now = Trial, SchedulerDecision.STOP, datetime.now
        self.count = 0

    def new(self) -> tuple[Any, dict[str, Any], int] | None:
        suggestion = self.scheduler.suggest()
        if suggestion is None:
            return None
        trial = self._trial(self.count, dict(suggestion.config), self._now())
        self.count += 1
        self.scheduler.on_trial_add(trial)
        return trial, trial.config, 0

    def report(self, handle: Any, epoch: int, value: float) -> bool:
        result = {"val_accuracy": value, "epoch": epoch}
        # as syne_tune.Tuner does: every result goes to on_trial_result; a STOP (also the
        # one at max_t) is followed by on_trial_remove, and then no on_trial_complete
        if self.scheduler.on_trial_result(handle, result) == self._stop:
            self.scheduler.on_trial_remove(handle)
            return False
        return True


PEERS = (
    "optuna-tpe-hb",
    "optuna-tpe-sha",
    "optuna-random-median",
    "syne-asha",
    "syne-bohb",
    "topk",
)
MISSING = {  # peers the issue names that the installed packages do not offer
    "syne-pasha": "Syne Tune 0.16 (the version on PyPI) has no PASHA",
    "syne-mobster": "Syne Tune 0.16 (the version on PyPI) has no MOBSTER",
}


def make_peer(name: str, seed: int, budget: int) -> Method:
    """The method ``name`` (one of :data:`PEERS`); ValueError for another name,
    ImportError where its package is not installed."""
    if name == "topk":
        return TopK(seed, budget)
    tool, _, variant = name.partition("-")
    if tool == "optuna" and variant in ("tpe-hb", "tpe-sha", "random-median"):
        return OptunaMethod(variant, seed)
    if tool == "syne" and variant in ("asha", "bohb"):
        return SyneMethod(variant, seed)
    if name in MISSING:
        raise ValueError(MISSING[name])
    raise ValueError(f"unknown peer method {name!r} (known: {', '.join(PEERS)})")
