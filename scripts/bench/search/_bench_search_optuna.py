"""Optuna's side of ``bench_search.py``: a sequential study with a pruner (a benchmark-only
dependency, imported when a study runs)."""

from __future__ import annotations

from typing import Any, Protocol, cast

from _bench_search_digits import CurveCache

from dlhpc.config.schema import HParam


class Charged(Protocol):
    """The run being charged (``bench_search.Run``)."""

    trials: int

    def charge(self, acc: float, cpu: float, length: int) -> bool: ...


def suggest(trial: Any, h: HParam) -> Any:
    """Optuna's draw for one dlhpc hyperparameter (log types are log10 exponents)."""
    if h.type == "categorical":
        return trial.suggest_categorical(h.name, list(h.vals))
    if h.type == "int":
        return trial.suggest_int(h.name, int(cast(float, h.minval)), int(cast(float, h.maxval)))
    lo, hi = cast(float, h.minval), cast(float, h.maxval)
    if h.type == "log":
        return trial.suggest_float(h.name, 10**lo, 10**hi, log=True)
    return trial.suggest_float(h.name, lo, hi)


def optuna_study(
    method: str,
    seed: int,
    space: dict[str, HParam],
    max_length: int,
    divisor: int,
    cache: CurveCache,
    run: Charged,
) -> None:
    """Run ``optuna-<sha|hb>-<random|tpe>`` until ``run.charge`` says the budget is spent.

    Each trial reports every epoch's accuracy and stops when ``should_prune()`` says so;
    parameters are suggested in name order, so a seed gives the same draws every run.
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    _, pruner_name, sampler_name = method.split("-")
    sampler: optuna.samplers.BaseSampler = (
        optuna.samplers.TPESampler(seed=seed)
        if sampler_name == "tpe"
        else optuna.samplers.RandomSampler(seed=seed)
    )
    pruner: optuna.pruners.BasePruner = (
        optuna.pruners.HyperbandPruner(
            min_resource=1, max_resource=max_length, reduction_factor=divisor
        )
        if pruner_name == "hb"
        else optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=divisor)
    )
    # A fixed name: HyperbandPruner picks brackets by a hash of the study name (else a uuid).
    study = optuna.create_study(
        study_name=f"bench-{method}-{seed}", direction="maximize", sampler=sampler, pruner=pruner
    )
    while True:
        trial = study.ask()
        hp = {name: suggest(trial, h) for name, h in sorted(space.items())}
        run.trials += 1
        acc = 0.0
        for epoch in range(1, max_length + 1):
            acc, cpu = cache.point(hp, seed, epoch)
            if run.charge(acc, cpu, epoch):
                return
            trial.report(acc, epoch)
            if trial.should_prune():
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                break
        else:
            study.tell(trial, acc)
        cache.release(hp, seed)
