#!/usr/bin/env python3
"""Benchmark: hyperparameter search on the digits example.

Runs dlhpc's searchers and Optuna's pruners side by side on one search space,
one compute budget (trial-epochs) and the same seeds, with real PyTorch training
of the digits MLP (``_bench_search_digits.py``; curves are cached, so a method is
charged for the epochs *it* trains, whatever the cache already held). For each
method and seed it records the compute (trial-epochs and CPU seconds) spent
when a trial first reports a validation accuracy >= the target, and the best
validation accuracy reported within the budget; it prints a markdown table of
medians and a JSON file with every run.

dlhpc searchers run in an event simulation of ``--workers`` slots on a virtual
clock (one epoch = 1 unit, or its CPU seconds with ``--clock cpu``): a trial
trains to its grant, telling val_accuracy after every epoch, then pauses and
frees its slot; Continue resumes it where it stopped; Stop ends it. Optuna runs
its usual sequential study (ask, report every epoch, ``should_prune``).

    . .venv/bin/activate; pip install -e '.[torch,bayes,bench]'
    python scripts/bench/search/bench_search.py --workers 4,1 --json results.json
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _bench_search_digits import CurveCache  # noqa: E402
from _bench_search_optuna import optuna_study  # noqa: E402
from _result import write_result  # noqa: E402

from dlhpc.config.schema import HParam, SearcherConfig  # noqa: E402
from dlhpc.search import make_searcher  # noqa: E402
from dlhpc.search.base import Continue, Create, Stop  # noqa: E402

# lr and weight_decay are log10 exponents (dlhpc's log type); count is for grid only.
# "base" is the default space; "wide" is one where good configurations are rarer.
SPACES: dict[str, dict[str, HParam]] = {
    "base": {
        "lr": HParam("lr", "log", minval=-4.5, maxval=-0.5, count=4),
        "hidden": HParam("hidden", "int", minval=8, maxval=256, count=2),
        "dropout": HParam("dropout", "double", minval=0.0, maxval=0.7, count=1),
        "batch_size": HParam("batch_size", "categorical", vals=(16, 32, 64, 128)),
        "weight_decay": HParam("weight_decay", "log", minval=-6.0, maxval=-1.0, count=1),
    },
    "wide": {
        "lr": HParam("lr", "log", minval=-6.0, maxval=0.0, count=4),
        "hidden": HParam("hidden", "int", minval=4, maxval=512, count=2),
        "dropout": HParam("dropout", "double", minval=0.0, maxval=0.9, count=1),
        "batch_size": HParam("batch_size", "categorical", vals=(16, 32, 64, 128, 256)),
        "weight_decay": HParam("weight_decay", "log", minval=-8.0, maxval=0.0, count=1),
    },
}
DLHPC_METHODS = ("asha", "hyperband", "random", "grid", "bayes")
OPTUNA_METHODS = ("optuna-sha-random", "optuna-sha-tpe", "optuna-hb-random", "optuna-hb-tpe")
CALIB_SEED = 1000  # the calibration sample's searcher and training seed (no run uses it)


@dataclass
class Run:
    """One method (label), one seed."""

    method: str
    seed: int
    workers: int = 1
    epochs_to_target: int | None = None
    cpu_to_target: float | None = None
    length_at_target: int | None = None  # epochs trained by the trial that reached it
    best: float = 0.0
    epochs: int = 0
    cpu: float = 0.0
    trials: int = 0
    note: str = ""
    _target: float = field(default=1.0, repr=False)
    _budget: int = field(default=0, repr=False)

    def charge(self, acc: float, cpu: float, length: int) -> bool:
        """Count one trained epoch that reported ``acc``; True once the budget is spent."""
        self.epochs += 1
        self.cpu += cpu
        self.best = max(self.best, acc)
        if self.epochs_to_target is None and acc >= self._target - 1e-9:
            self.epochs_to_target, self.cpu_to_target = self.epochs, round(self.cpu, 3)
            self.length_at_target = length
        return self.epochs >= self._budget

    def public(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if not k.startswith("_")}


@dataclass
class _Trial:
    hp: dict[str, Any]
    grant: int
    length: int = 0
    running: bool = False
    stopping: bool = False


def searcher_config(name: str, seed: int, args: argparse.Namespace) -> SearcherConfig:
    full = args.budget // args.max_length  # full trainings the budget pays for
    trials = {"random": full + args.workers, "bayes": full}.get(name, full)
    if name in ("asha", "hyperband", "sha"):
        trials = natural_trials(name, seed, args)
    return SearcherConfig(
        name=name,
        metric="val_accuracy",
        smaller_is_better=False,
        max_trials=trials,
        max_length=args.max_length,
        divisor=args.divisor,
        max_rungs=args.max_rungs,
        seed=seed,
    )


def natural_trials(name: str, seed: int, args: argparse.Namespace) -> int:
    """The largest max_trials whose expected spend fits the budget.

    Expected spend: each rung of a bracket keeps 1/divisor of the one below it,
    so a trial of bracket lengths l_0 < l_1 < ... costs sum_k (l_k - l_{k-1}) / divisor^k.
    """
    base = SearcherConfig(
        name=name,
        metric="val_accuracy",
        max_length=args.max_length,
        divisor=args.divisor,
        max_rungs=args.max_rungs,
        seed=seed,
    )

    def spend(n: int) -> float:
        brackets = make_searcher(SPACES[args.space], replace(base, max_trials=n)).brackets  # type: ignore[attr-defined]
        return float(
            sum(
                b.trials
                * sum(
                    (hi - lo) / args.divisor**k
                    for k, (lo, hi) in enumerate(zip((0, *b.lengths), b.lengths, strict=False))
                )
                for b in brackets
            )
        )

    n = 1
    while spend(n + 1) <= args.budget:
        n += 1
    return n


def run_dlhpc(name: str, seed: int, args: argparse.Namespace, cache: CurveCache, run: Run) -> None:
    """Event simulation of ``args.workers`` slots driving one dlhpc searcher."""
    searcher = make_searcher(SPACES[args.space], searcher_config(name, seed, args))
    trials: dict[int, _Trial] = {}
    events: list[tuple[float, int, int]] = []  # (end time of the epoch in progress, seq, rid)
    now, seq = 0.0, 0

    def start_epoch(rid: int) -> None:
        nonlocal seq
        t = trials[rid]
        t.running = True
        _, cpu = cache.point(t.hp, seed, t.length + 1)
        heapq.heappush(events, (now + (cpu if args.clock == "cpu" else 1.0), seq, rid))
        seq += 1

    def end(rid: int) -> None:
        trials[rid].running = False
        searcher.tell_exited(rid)
        cache.release(trials[rid].hp, seed)

    while not searcher.done:
        free = args.workers - sum(t.running for t in trials.values())
        ops = searcher.ask(free)
        for op in ops:
            if isinstance(op, Create):
                trials[op.request_id] = _Trial(op.hparams, op.length)
                run.trials += 1
                start_epoch(op.request_id)
            elif isinstance(op, Continue):
                t = trials[op.request_id]
                t.grant = op.length
                if not t.running:
                    start_epoch(op.request_id)
            elif isinstance(op, Stop):
                if trials[op.request_id].running:  # ends after the epoch in progress
                    trials[op.request_id].stopping = True
                else:
                    end(op.request_id)
        if not events:
            if not ops:
                run.note = "searcher stalled: nothing running and nothing asked"
                return
            continue
        now = events[0][0]
        while events and events[0][0] == now:
            _, _, rid = heapq.heappop(events)
            t = trials[rid]
            t.length += 1
            acc, cpu = cache.point(t.hp, seed, t.length)
            if run.charge(acc, cpu, t.length):
                return
            if t.stopping:  # the epoch is paid for; its report comes too late
                end(rid)
                continue
            searcher.tell(rid, t.length, acc)
            if t.length >= args.max_length:
                end(rid)
            elif t.length >= t.grant:
                t.running = False  # paused: checkpointed, slot freed
            else:
                start_epoch(rid)
    run.note = "searcher done before the budget"


def run_optuna(
    method: str, seed: int, args: argparse.Namespace, cache: CurveCache, run: Run
) -> None:
    """A sequential Optuna study with the same space, trainer and budget."""
    optuna_study(method, seed, SPACES[args.space], args.max_length, args.divisor, cache, run)


def calibrate(args: argparse.Namespace, cache: CurveCache) -> dict[str, Any]:
    """Final accuracies of a random sample of configs, trained to max_length."""
    cfg = replace(searcher_config("random", CALIB_SEED, args), max_trials=args.calib_configs)
    ops = make_searcher(SPACES[args.space], cfg).ask(args.calib_configs)
    curves = []
    for op in ops:
        assert isinstance(op, Create)
        curves.append(
            [cache.point(op.hparams, CALIB_SEED, e)[0] for e in range(1, args.max_length + 1)]
        )
        cache.release(op.hparams, CALIB_SEED)
    finals = sorted(c[-1] for c in curves)
    rank = max(1, math.ceil(args.target_pct / 100 * len(finals)))  # nearest rank
    target = args.target if args.target is not None else finals[rank - 1]
    return {
        "configs": len(curves),
        "percentile": args.target_pct,
        "target": target,
        "final_quartiles": [round(q, 4) for q in statistics.quantiles(finals, n=4)],
        "final_max": max(finals),
        "share_reaching_target_any_epoch": sum(max(c) >= target - 1e-9 for c in curves)
        / len(curves),
        "share_reaching_target_at_final": sum(c[-1] >= target - 1e-9 for c in curves) / len(curves),
    }


def _median(values: list[float | None]) -> float:
    """Median with 'never' (None) counted as +inf."""
    return statistics.median([math.inf if v is None else v for v in values])


def random_label(labels: list[str], workers: int) -> str | None:
    """The random-search row run with ``workers`` slots (else the first one)."""
    rows = [m for m in labels if m.split(" ")[0] == "random"]
    return next((m for m in rows if m in ("random", f"random w={workers}")), None) or (
        rows[0] if rows else None
    )


def table(runs: list[Run], methods: list[str], budget: int) -> tuple[str, dict[str, float]]:
    med = {m: _median([r.epochs_to_target for r in runs if r.method == m]) for m in methods}
    lines = [
        "| method | seeds reaching target | median trial-epochs to target | vs random "
        "| median CPU-s to target | median best val_accuracy at budget | median trials |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in methods:
        rs = [r for r in runs if r.method == m]
        ref_label = random_label(methods, rs[0].workers)
        ref = med[ref_label] if ref_label is not None else math.inf
        hit = sum(r.epochs_to_target is not None for r in rs)
        e, cpu = med[m], _median([r.cpu_to_target for r in rs])
        if math.isinf(e):
            ratio = "n/a"
        elif math.isinf(ref):
            ratio = f"< {e / budget:.2f}"  # random's median is beyond the budget
        else:
            ratio = f"{e / ref:.2f}"
        lines.append(
            f"| {m} | {hit}/{len(rs)} | {'> budget' if math.isinf(e) else f'{e:g}'} | {ratio} "
            f"| {'> budget' if math.isinf(cpu) else f'{cpu:.1f}'} "
            f"| {statistics.median(r.best for r in rs):.4f} "
            f"| {statistics.median(r.trials for r in rs):g} |"
        )
    return "\n".join(lines), med


def verdict(value: float, ref: float, factor: float, budget: int) -> str:
    """Whether ``value <= factor * ref``, medians where +inf means beyond the budget."""
    if math.isinf(value):
        return "undetermined (neither reached)" if math.isinf(ref) else "no"
    if math.isinf(ref):  # ref > budget, so value <= factor * budget suffices
        return "yes" if value <= factor * budget else "undetermined (reference beyond budget)"
    return "yes" if value <= factor * ref else "no"


def _default_cache() -> Path:
    """The curve cache in the user's cache folder (``$XDG_CACHE_HOME``, else ``~/.cache``)."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "dlhpc" / "bench-search-curves.json"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--methods", default=",".join(DLHPC_METHODS + OPTUNA_METHODS))
    p.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1 (searcher and training)")
    p.add_argument("--workers", default="4", help="slots of the dlhpc simulation; a list runs each")
    p.add_argument("--max-length", type=int, default=27, help="R, epochs of a full training")
    p.add_argument("--divisor", type=int, default=3)
    p.add_argument("--max-rungs", type=int, default=5)
    p.add_argument("--budget", type=int, default=30, help="full trainings (x max_length epochs)")
    p.add_argument("--calib-configs", type=int, default=100)
    p.add_argument("--target-pct", type=float, default=99.0)
    p.add_argument("--target", type=float, default=None, help="skip the percentile rule")
    p.add_argument("--space", choices=sorted(SPACES), default="base")
    p.add_argument("--clock", choices=("epochs", "cpu"), default="epochs")
    p.add_argument(
        "--cache",
        type=Path,
        default=_default_cache(),
        help="curves already trained, reused across runs (per user; not under /tmp)",
    )
    p.add_argument("--json", type=Path, default=None, help="write every run here")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.monotonic()
    budget = args.budget * args.max_length
    args.budget = budget
    workers = [int(w) for w in args.workers.split(",")]
    args.workers = workers[0]  # what calibrate() sees; each run gets its own
    plan: list[tuple[str, str, int]] = []  # (label, method, workers)
    for m in (m for m in args.methods.split(",") if m):
        if m.startswith("optuna-"):  # a sequential study: one slot
            plan.append((m, m, 1))
        else:
            plan += [(m if len(workers) == 1 else f"{m} w={w}", m, w) for w in workers]
    cache = CurveCache(args.cache)
    calib = calibrate(args, cache)
    cache.save()
    print(f"calibration: {json.dumps(calib)}", flush=True)
    runs: list[Run] = []
    skipped: dict[str, str] = {}
    for label, method, w in plan:
        drive: Callable[[str, int, argparse.Namespace, CurveCache, Run], None]
        drive = run_optuna if method.startswith("optuna-") else run_dlhpc
        run_args = argparse.Namespace(**{**vars(args), "workers": w})
        for seed in range(args.seeds):
            run = Run(label, seed, w, _target=calib["target"], _budget=budget)
            t1 = time.monotonic()
            try:
                drive(method, seed, run_args, cache, run)
            except (NotImplementedError, ImportError) as exc:
                skipped[label] = f"{type(exc).__name__}: {exc}"
                break
            finally:
                cache.release_all()
            cache.save()
            runs.append(run)
            print(f"{json.dumps(run.public())} ({time.monotonic() - t1:.0f} s)", flush=True)
    done = [label for label, _, _ in plan if label not in skipped]
    text, med = table(runs, done, budget)
    elapsed = time.monotonic() - t0
    print(
        f"\nbudget {budget} trial-epochs ({budget // args.max_length} x {args.max_length}), "
        f"target val_accuracy >= {calib['target']:.4f}, {args.seeds} seeds, "
        f"dlhpc workers {','.join(map(str, workers))} (Optuna: 1), clock {args.clock}\n"
    )
    print(text)
    for method, why in skipped.items():
        print(f"\nskipped {method}: {why}")
    optuna = [med[m] for m in done if m.startswith("optuna-")]
    for label, method, w in plan:
        ref = random_label(done, w)
        if method != "asha" or label not in med or ref is None:
            continue
        print(
            f"\n{label}: <= 1/5 of {ref}: {verdict(med[label], med[ref], 0.2, budget)}; "
            "<= Optuna's best pruner: "
            + (verdict(med[label], min(optuna), 1.0, budget) if optuna else "n/a (not run)")
        )
    print(
        f"\nruntime {elapsed:.0f} s; real epochs trained {cache.epochs_trained}, "
        f"replay mismatches {cache.replay_mismatches}"
    )
    if args.json is not None:
        write_result(
            args.json,
            {
                "args": {**{k: str(v) for k, v in vars(args).items()}, "workers": workers},
                "calibration": calib,
                "runs": [r.public() for r in runs],
                "median_epochs_to_target": {
                    m: None if math.isinf(e) else e for m, e in med.items()
                },  # None: beyond the budget
                "skipped": skipped,
                "runtime_s": round(elapsed, 1),
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
