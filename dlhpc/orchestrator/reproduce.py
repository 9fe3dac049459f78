"""``dlhpc reproduce`` and ``dlhpc diff``: a trial again, and two trials compared.

:func:`plan_reproduce` reads a trial and its experiment (writes nothing) and
builds the reproduction: the original experiment's resolved config with searcher
``single``, the trial's hyperparameters as constants, its length and its exact
seed (``reproducibility.trial_seed``); the code is the original run folder's
snapshot (``runs/exp-N/code``), never the workdir as it is now. It also collects
today's launch record and lists what differs from the original's record
(packages, Python, modules, Slurm, data; CPU/GPU on the local backend, where
this machine is the one that runs the job). :func:`reproduce` launches it; with
a checkpoint in the plan (``--from-checkpoint``), a copy of the original trial's
newest verified checkpoint is put in the new trial's checkpoint folder before
the job is submitted. That checkpoint is found from trusted roots: the configured
``checkpoint.dir`` and the folder names the login node recorded, each folder below
reached without a symlink (:mod:`._contained`), checked again just before the copy,
and the copy verified. :func:`diff_trials` (with the store's ``trial_record_of``) serves
``dlhpc diff``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sqlalchemy import select

from dlhpc._perms import copy_file
from dlhpc.config import MAX_NAME_LENGTH
from dlhpc.config.schema import ExperimentConfig, HParam
from dlhpc.config.serde import to_jsonable
from dlhpc.errors import UsageError
from dlhpc.orchestrator._contained import newest_checkpoint
from dlhpc.orchestrator.eventlog import log_event
from dlhpc.orchestrator.launch import launch
from dlhpc.orchestrator.pool import SchedulerPool
from dlhpc.orchestrator.runfiles import trial_spec
from dlhpc.orchestrator.stored import config_of
from dlhpc.protocol import layout
from dlhpc.protocol.checkpoint import latest_verified
from dlhpc.repro import (
    Difference,
    attempt_record,
    code_record,
    collect_launch_record,
    diff_records,
    fingerprint_data,
    trial_record,
)
from dlhpc.scheduler.plugins import BackendTable
from dlhpc.store import Experiment, Store, Trial
from dlhpc.store.checkpoint_dirs import TrialCheckpointDir, trial_checkpoint_dir
from dlhpc.store.queries import trial_record_of

__all__ = [
    "ReproducePlan",
    "ReproduceResult",
    "diff_trials",
    "plan_reproduce",
    "reproduce",
]

NOW_SECTIONS = ("python", "packages", "conda", "modules", "slurm", "data")
LOCAL_NOW_SECTIONS = (*NOW_SECTIONS, "cpu", "gpu")


@dataclass
class ReproducePlan:
    """What :func:`reproduce` launches, and what differs from the original today."""

    trial_id: int  # the original trial
    experiment_id: int  # its experiment
    cfg: ExperimentConfig  # the reproduction's config
    hparams: dict[str, Any]
    seed: int
    max_length: int
    code_dir: Path  # the original's snapshot
    yaml_text: str
    record: dict[str, Any]  # the reproduction's launch record
    checkpoint: Path | None = None  # copied into the new trial's checkpoint folder
    differences: list[Difference] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    source: TrialCheckpointDir | None = None  # the original trial's checkpoint folder


@dataclass
class ReproduceResult:
    experiment_id: int
    trial_id: int
    job_ids: list[str]


def volatile_env(backends: BackendTable) -> frozenset[str]:
    """Every registered backend's variables that differ between attempts by construction."""
    found: set[str] = set()
    for name in backends.names():
        cls = backends.get(name).environment
        found |= cls.volatile_vars if cls is not None else set()
    return frozenset(found)


def diff_trials(store: Store, a: int, b: int) -> list[Difference]:
    """The differences between trials ``a`` and ``b``'s records."""
    volatile = volatile_env(BackendTable())
    with store.read() as session:
        return diff_records(
            trial_record_of(session, a), trial_record_of(session, b), volatile=volatile
        )


def _reproduction_config(
    cfg: ExperimentConfig, trial_id: int, exp_id: int, hp: dict[str, Any], seed: int, length: int
) -> ExperimentConfig:
    return replace(
        cfg,
        name=f"{cfg.name}-repro-t{trial_id}"[:MAX_NAME_LENGTH],
        description=f"reproduction of trial {trial_id} (experiment {exp_id})",
        hyperparameters={k: HParam(k, "const", value=v) for k, v in sorted(hp.items())},
        searcher=replace(
            cfg.searcher,
            name="single",
            max_trials=1,
            max_concurrent_trials=0,
            max_length=length,
            min_length=None,
            mode=None,
            stop_once=False,
            proposer=None,
            proposer_settings={},
            max_budget=None,
        ),
        reproducibility=replace(cfg.reproducibility, trial_seed=seed),
    )


@dataclass(frozen=True)
class _Original:
    """The trial to reproduce and its experiment, as read in one read transaction."""

    record: dict[str, Any]  # the trial's reproducibility record (trial_record_of)
    exp_id: int
    run_dir: Path  # the experiment's run folder
    yaml_text: str
    cfg: ExperimentConfig  # the experiment's config as launched


def _read_original(store: Store, trial_id: int) -> _Original:
    """Read the trial's record and its experiment (NotFoundError: no such trial)."""
    with store.read() as session:
        original = trial_record_of(session, trial_id)
        trial = session.get(Trial, trial_id)
        assert trial is not None  # trial_record_of checked
        exp = trial.experiment
        return _Original(original, exp.id, Path(exp.run_dir), exp.yaml_text, config_of(exp))


def plan_reproduce(
    store: Store, pool: SchedulerPool, trial_id: int, from_checkpoint: bool = False
) -> ReproducePlan:
    """The reproduction of trial ``trial_id`` (see the module docstring); writes nothing
    (``pool``'s backend is asked for its version).

    Raises NotFoundError for an unknown trial and UsageError when the original's
    code snapshot is gone or (``from_checkpoint``) it has no verified checkpoint.
    """
    orig = _read_original(store, trial_id)
    exp_id, original = orig.exp_id, orig.record
    hp, seed, length = (original["trial"][k] for k in ("hparams", "seed", "max_length"))
    code_dir = layout.code_dir(orig.run_dir)
    if not code_dir.is_dir():
        raise UsageError(
            f"the code snapshot of experiment {exp_id} ({code_dir}) is gone; cannot reproduce"
        )
    cfg = _reproduction_config(orig.cfg, trial_id, exp_id, hp, seed, length)
    checkpoint, source = None, None
    if from_checkpoint:
        source = _checkpoint_source(store, exp_id, trial_id)
        checkpoint = _newest(source, trial_id)
    notes: list[str] = []
    record = _launch_record(pool, cfg, orig, code_dir, trial_id, checkpoint, notes)
    local = pool.backends.get(cfg.backend).runs_here
    now_attempt = _attempt_now(record, local, trial_id, notes)
    if not original["attempt"]:
        notes.append(f"trial {trial_id} has no attempt record: its GPU and data are not compared")
    now = trial_record(record, to_jsonable(cfg), hp, seed, length, now_attempt)
    sections = LOCAL_NOW_SECTIONS if local else NOW_SECTIONS
    diffs = diff_records(original, now, sections, volatile_env(pool.backends))
    return ReproducePlan(
        trial_id, exp_id, cfg, hp, seed, length, code_dir, orig.yaml_text, record, checkpoint,
        diffs, notes, source,
    )  # fmt: skip


def _checkpoint_source(store: Store, exp_id: int, trial_id: int) -> TrialCheckpointDir:
    """Trial ``trial_id``'s checkpoint folder as recorded (its experiment's configured
    ``checkpoint.dir`` and folder names), never a path a job wrote."""
    with store.read() as s:
        exp = s.get(Experiment, exp_id)
        own = trial_checkpoint_dir(exp, trial_id) if exp is not None else None
    if own is None:
        raise UsageError(f"experiment {exp_id} has no checkpoint folder")
    return own


def _newest(source: TrialCheckpointDir, trial_id: int) -> Path:
    """The newest verified checkpoint of ``source`` (:func:`newest_checkpoint`);
    UsageError when there is none or a folder is a symlink."""
    ckpt = newest_checkpoint(source)
    if ckpt is None:
        raise UsageError(f"trial {trial_id} has no verified checkpoint in {source.path}")
    return ckpt


def _copy_checkpoint(plan: ReproducePlan, dest: Path) -> None:
    """Copy the plan's checkpoint into ``dest`` (the new trial's folder): checked again
    now (still the original's newest, reached without a symlink), copied without
    following a link, and the copy verified."""
    assert plan.source is not None and plan.checkpoint is not None  # a checkpoint plan
    src = _newest(plan.source, plan.trial_id)
    if src.name != plan.checkpoint.name:
        raise UsageError(f"trial {plan.trial_id}'s newest checkpoint is now {src}; plan again")
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src, dest / src.name, symlinks=True, copy_function=copy_file)
    copied, torn = latest_verified(dest)
    if copied is None or copied.path.name != src.name:
        why = torn[0].reason if torn else "not found"
        raise UsageError(f"the copy of {src} does not verify: {why}")


def _launch_record(
    pool: SchedulerPool,
    cfg: ExperimentConfig,
    orig: _Original,
    code_dir: Path,
    trial_id: int,
    checkpoint: Path | None,
    notes: list[str],
) -> dict[str, Any]:
    """Today's launch record of the reproduction: the original's code facts (its
    snapshot's when it has no launch record: a note is appended to ``notes``), the
    original YAML's hash, and what it reproduces."""
    code = orig.record["experiment"].get("code")
    if not code:
        notes.append(
            f"experiment {orig.exp_id} has no launch record; code identified by its snapshot"
        )
        code = code_record(code_dir)
    version = pool.get(cfg.backend).version_record()
    record = collect_launch_record(cfg, code=code, scheduler_version=version)
    record["config"]["yaml_sha256"] = hashlib.sha256(orig.yaml_text.encode()).hexdigest()
    record["reproduces"] = {
        "trial_id": trial_id,
        "experiment_id": orig.exp_id,
        "checkpoint": str(checkpoint) if checkpoint else None,
    }
    return record


def _attempt_now(
    record: dict[str, Any], local: bool, trial_id: int, notes: list[str]
) -> dict[str, Any]:
    """What an attempt would record today: the data's fingerprints, and on a backend
    that runs jobs here (``local``) this machine's CPU and GPUs; elsewhere a note on
    comparing them once the job runs is appended to ``notes``."""
    now_attempt: dict[str, Any] = {"data": fingerprint_data(record["data"])}
    if local:  # this machine runs the job: its CPU and GPUs are the job's
        now_attempt.update(
            {k: v for k, v in attempt_record(os.environ).items() if k in ("cpu", "gpu")}
        )
    else:
        notes.append(
            "GPU, driver and CPU are known once the job runs: compare them then with"
            f" `dlhpc diff {trial_id} NEW_TRIAL_ID`"
        )
    return now_attempt


def reproduce(store: Store, pool: SchedulerPool, plan: ReproducePlan) -> ReproduceResult:
    """Launch ``plan`` as a new experiment of one trial; returns its ids and jobs."""
    new_trial: list[int] = []

    def prepare(exp_id: int) -> None:
        with store.read() as session:
            tid = session.scalar(select(Trial.id).where(Trial.experiment_id == exp_id))
            run_dir = session.scalar(select(Experiment.run_dir).where(Experiment.id == exp_id))
        assert tid is not None and run_dir is not None  # launch recorded both
        new_trial.append(tid)
        if plan.checkpoint is not None:
            spec = trial_spec(
                plan.cfg,
                store.runs_root,
                exp_id,
                tid,
                plan.hparams,
                plan.max_length,
                plan.seed,
                slug=layout.recorded_slug(exp_id, run_dir),
            )
            _copy_checkpoint(plan, Path(spec.checkpoint_dir))
        with store.write() as session:
            how = f" from checkpoint {plan.checkpoint}" if plan.checkpoint else ""
            log_event(
                session,
                "reproduce",
                f"reproduces trial {plan.trial_id} of experiment {plan.experiment_id}"
                f" (seed {plan.seed}){how}",
                exp_id,
                tid,
            )

    result = launch(
        plan.cfg,
        store,
        pool,
        code_from=plan.code_dir,
        record=plan.record,
        prepare=prepare,
        yaml_text=plan.yaml_text,
    )
    return ReproduceResult(result.experiment_id, new_trial[0], result.job_ids)
