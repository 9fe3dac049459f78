"""The YAHPO Gym LCBench surrogate for ``bench_search_lcbench.py`` (onnxruntime + numpy only).

Data: the ``lcbench`` surrogate of YAHPO Gym v1.0 (Pfisterer et al. 2022, AutoML Conf),
fitted to LCBench (Zimmer, Lindauer & Hutter 2021, IEEE TPAMI 43(9)); Apache-2.0. Its
folder (model.onnx, encoding.json, instance_target_statistics.csv, QUERYING.md) is found
by :func:`data_dir`. How it is queried is QUERYING.md's: ``x_cat`` int32 [N, 1] (the task's
code from encoding.json), ``x_cont`` float32 [N, 8] in the column order :data:`INPUTS`, raw
values in natural units, integer parameters as whole-number floats; ``output`` float32
[N, 6] in the order :data:`OUTPUTS`.

The budget is the surrogate's epochs 2..51 (QUERYING.md's caveats: epoch 1 is the
untrained network and epoch 52 mostly repeats 51), so budget epoch ``k`` (1..50) is
surrogate epoch ``k + 1`` and :data:`MAX_LENGTH` is 50. Budget epoch ``k`` takes
``time[k + 1] - time[k]`` seconds (``time`` is cumulative), floored at
:data:`MIN_EPOCH_FRACTION` of the curve's mean epoch (the predicted time is not always
increasing). A curve is a pure function of (task, configuration): the surrogate has no
noise, so a trial's seed does not change it.
"""

from __future__ import annotations

import csv
import json
import math
import os
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dlhpc.config.schema import HParam
from dlhpc.search import sample

INPUTS = (
    "epoch",
    "batch_size",
    "learning_rate",
    "momentum",
    "weight_decay",
    "num_layers",
    "max_units",
    "max_dropout",
)
OUTPUTS = (
    "time",
    "val_accuracy",
    "val_cross_entropy",
    "val_balanced_accuracy",
    "test_cross_entropy",
    "test_balanced_accuracy",
)
INTEGER = ("batch_size", "num_layers", "max_units")
MAX_LENGTH = 50  # budget epochs 1..50 = surrogate epochs 2..51
MIN_EPOCH_FRACTION = 0.05
NOT_TASKS = ("#na#", "167083")  # encoding codes that are not benchmark tasks (QUERYING.md)
ENV = "DLHPC_LCBENCH_DIR"

# dlhpc's space for config_space.json's (log types are exponents, as dlhpc's log type is);
# ``count`` is for the grid searcher only (3*4*2*2*3*3*2 = 864 points).
SPACE: dict[str, HParam] = {
    "batch_size": HParam("batch_size", "log", minval=4.0, maxval=9.0, base=2.0, count=3),
    "learning_rate": HParam("learning_rate", "log", minval=-4.0, maxval=-1.0, count=4),
    "momentum": HParam("momentum", "double", minval=0.1, maxval=0.99, count=2),
    "weight_decay": HParam("weight_decay", "double", minval=1e-5, maxval=0.1, count=2),
    "num_layers": HParam("num_layers", "int", minval=1, maxval=5, count=3),
    "max_units": HParam("max_units", "log", minval=6.0, maxval=10.0, base=2.0, count=3),
    "max_dropout": HParam("max_dropout", "double", minval=0.0, maxval=1.0, count=2),
}


def data_dir(given: Path | None = None) -> Path:
    """The surrogate's folder: ``given``, else ``$DLHPC_LCBENCH_DIR``, else
    ``shared/benchmarks/yahpo-lcbench`` beside the checkout or one level above it.
    FileNotFoundError naming every place looked at when none has model.onnx."""
    repo = Path(__file__).resolve().parents[3]
    rel = Path("shared/benchmarks/yahpo-lcbench")
    env = os.environ.get(ENV)
    places = (
        [given]
        if given is not None
        else [Path(env)]
        if env
        else [repo.parent / rel, repo.parent.parent / rel]
    )
    for place in places:
        if (place / "model.onnx").is_file():
            return place
    raise FileNotFoundError(
        f"LCBench surrogate not found (model.onnx) in: {', '.join(map(str, places))}"
        f" (set --data or ${ENV})"
    )


def config_row(hp: Mapping[str, Any]) -> list[float]:
    """The 7 configuration columns of ``x_cont`` (after ``epoch``), integers rounded."""
    row = []
    for name in INPUTS[1:]:
        value = float(hp[name])
        row.append(float(round(value)) if name in INTEGER else value)
    return row


@dataclass(frozen=True)
class Curve:
    """One configuration's budget curve: ``values[k-1]`` and ``seconds[k-1]`` of budget
    epoch ``k`` (1..:data:`MAX_LENGTH`)."""

    values: tuple[float, ...]
    seconds: tuple[float, ...]

    @property
    def final(self) -> float:
        return self.values[-1]


class Surrogate:
    """The ONNX model on one CPU thread, with a curve cache per (task, configuration)."""

    def __init__(self, folder: Path | None = None, metric: str = "val_accuracy") -> None:
        import onnxruntime as ort  # a benchmark-only dependency (the `bench` extra)

        self.folder = data_dir(folder)
        if metric not in OUTPUTS[1:]:
            raise ValueError(f"metric must be one of {', '.join(OUTPUTS[1:])}, got {metric!r}")
        self.metric = metric
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        self.session = ort.InferenceSession(
            str(self.folder / "model.onnx"), opts, providers=["CPUExecutionProvider"]
        )
        codes = json.loads((self.folder / "encoding.json").read_text())["OpenML_task_id"]
        self.codes: dict[str, int] = {k: int(v) for k, v in codes.items() if k not in NOT_TASKS}
        self._cache: dict[tuple[str, tuple[float, ...]], Curve] = {}
        self.queries = 0  # configurations sent to the model

    @property
    def tasks(self) -> list[str]:
        """The 34 task ids, sorted as numbers."""
        return sorted(self.codes, key=int)

    def raw(self, task: str, rows: Sequence[Sequence[float]], epochs: Sequence[int]) -> Any:
        """The model's output [len(rows) * len(epochs), 6], config-major (rows as
        :func:`config_row` gives them; ``epochs`` are surrogate epochs 1..52)."""
        if task not in self.codes:
            raise ValueError(f"unknown LCBench task {task!r}")
        cfg = np.asarray(rows, dtype=np.float32).reshape(len(rows), 7)
        ep = np.asarray(epochs, dtype=np.float32)
        x_cont = np.concatenate(
            [np.repeat(ep[None, :, None], len(cfg), 0), np.repeat(cfg[:, None, :], len(ep), 1)], 2
        ).reshape(-1, 8)
        x_cat = np.full((len(x_cont), 1), self.codes[task], dtype=np.int32)
        return self.session.run(["output"], {"x_cat": x_cat, "x_cont": x_cont})[0]

    def curves(self, task: str, configs: Sequence[Mapping[str, Any]]) -> list[Curve]:
        """The budget curves of ``configs`` on ``task`` (one model call for the uncached)."""
        keys = [(task, tuple(config_row(hp))) for hp in configs]
        todo = list(dict.fromkeys(k for k in keys if k not in self._cache))
        if todo:
            out = self.raw(task, [k[1] for k in todo], range(1, MAX_LENGTH + 2))
            out = out.reshape(len(todo), MAX_LENGTH + 1, len(OUTPUTS)).astype(np.float64)
            col = OUTPUTS.index(self.metric)
            for key, block in zip(todo, out, strict=True):
                t = block[:, 0]
                steps = np.diff(t)  # budget epoch k: time[k+1] - time[k]
                mean = max((t[-1] - t[0]) / MAX_LENGTH, 1e-6)
                steps = np.maximum(steps, MIN_EPOCH_FRACTION * mean)
                values = block[1:, col]
                self._cache[key] = Curve(tuple(map(float, values)), tuple(map(float, steps)))
            self.queries += len(todo)
        return [self._cache[k] for k in keys]

    def curve(self, task: str, hp: Mapping[str, Any]) -> Curve:
        return self.curves(task, [hp])[0]

    def clear(self) -> None:
        """Forget the cached curves (a run's thousands of configurations add up)."""
        self._cache.clear()


def random_configs(n: int, seed: str | int) -> list[dict[str, Any]]:
    """``n`` configurations from dlhpc's own sampler over :data:`SPACE` (names sorted)."""
    rng = random.Random(f"lcbench.random:{seed}")
    return [{name: sample(SPACE[name], rng) for name in sorted(SPACE)} for _ in range(n)]


@dataclass(frozen=True)
class TaskReference:
    """What a run on ``task`` is judged by: ``best`` is the best final (budget epoch 50)
    metric of ``samples`` random configurations (seed ``"reference"``, no run uses it);
    ``target = best - points``; ``lo``/``hi`` are instance_target_statistics.csv's min and
    max of the metric (500,000 surrogate points), YAHPO's normalisation of regret;
    ``share`` is the fraction of the samples whose final value reaches the target.
    ``random_epochs`` and ``random_gpu_hours``: random search's exact expected compute
    until a trial first reports a value >= the target (:func:`random_expectation`)."""

    task: str
    best: float
    target: float
    lo: float
    hi: float
    share: float
    samples: int
    random_epochs: float
    random_gpu_hours: float

    def regret(self, value: float) -> float:
        """Normalised regret of ``value``: (hi - value) / (hi - lo)."""
        return (self.hi - value) / max(self.hi - self.lo, 1e-12)


def statistics_range(folder: Path, task: str, metric: str) -> tuple[float, float]:
    """(min, max) of ``metric`` on ``task`` from instance_target_statistics.csv."""
    found: dict[str, float] = {}
    with (folder / "instance_target_statistics.csv").open() as f:
        for row in csv.DictReader(f):
            if row["instance"] == task and row["metric"] == metric:
                found[row["statistic"]] = float(row["value"])
    if set(found) != {"min", "max"}:
        raise ValueError(f"instance_target_statistics.csv: no min/max of {metric} for {task}")
    return found["min"], found["max"]


def reference(
    surrogate: Surrogate, task: str, samples: int = 2000, points: float = 1.0
) -> TaskReference:
    """The :class:`TaskReference` of ``task`` (deterministic)."""
    curves = surrogate.curves(task, random_configs(samples, "reference"))
    best = max(c.final for c in curves)
    lo, hi = statistics_range(surrogate.folder, task, surrogate.metric)
    share = sum(c.final >= best - points for c in curves) / len(curves)
    epochs, gpu_s = random_expectation(curves, best - points)
    return TaskReference(task, best, best - points, lo, hi, share, samples, epochs, gpu_s / 3600)


def random_expectation(curves: Sequence[Curve], target: float) -> tuple[float, float]:
    """Random search's expected (epochs, GPU-seconds) until a trial first reports a value
    >= ``target``, drawing configurations from ``curves`` with replacement and training
    each to :data:`MAX_LENGTH` one after the other (W = 1): with ``p`` the share of curves
    that reach the target at some epoch, (1 - p) / p misses at their full cost, then a hit
    at its mean cost up to its first epoch at the target. Exact, never censored;
    ValueError when no curve reaches the target."""
    hits: list[tuple[int, float]] = []  # (epochs, seconds) up to the first report >= target
    miss_epochs = miss_s = 0.0
    for c in curves:
        first = next((i for i, v in enumerate(c.values) if v >= target), None)
        if first is None:
            miss_epochs += len(c.values)
            miss_s += math.fsum(c.seconds)
        else:
            hits.append((first + 1, math.fsum(c.seconds[: first + 1])))
    if not hits:
        raise ValueError(f"no curve reaches the target {target}")
    # (1 - p) / p misses of mean cost m = misses / (n - k) each: (n - k) / k * m = total / k
    epochs = (miss_epochs + sum(e for e, _ in hits)) / len(hits)
    seconds = (miss_s + math.fsum(s for _, s in hits)) / len(hits)
    return epochs, seconds
