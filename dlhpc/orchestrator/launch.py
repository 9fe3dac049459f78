"""``dlhpc launch``: dry-run (render) and schedule (record + submit)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from dlhpc import _perms
from dlhpc._perms import make_dirs, remove_tree
from dlhpc.config.lines import key_issue
from dlhpc.config.schema import ExperimentConfig
from dlhpc.config.serde import to_jsonable
from dlhpc.errors import ConfigError, SchedulerError
from dlhpc.orchestrator.clock import Clock, experiment_end, store_clock
from dlhpc.orchestrator.eventlog import log_event
from dlhpc.orchestrator.new_trials import add_trials
from dlhpc.orchestrator.pool import SchedulerPool
from dlhpc.orchestrator.request import DRY_RUN_UID, job_request
from dlhpc.orchestrator.runfiles import publish_staging, stage_run_folder
from dlhpc.orchestrator.stored import searcher_of, state_json
from dlhpc.orchestrator.submit import submit_pending
from dlhpc.protocol import checkpoint_experiment_dir, experiment_dir, trial_dir
from dlhpc.repro import collect_launch_record
from dlhpc.scheduler import SubmittedTask
from dlhpc.search import Create
from dlhpc.states import ExperimentState
from dlhpc.store import Experiment, Store
from dlhpc.store.store import DB_NAME

__all__ = ["DryRun", "LaunchResult", "launch", "plan_launch"]

_ASK_ALL = 1_000_000


@dataclass
class DryRun:
    """What ``launch`` would do: the trials and the exact submission scripts."""

    experiment_id: int  # the id it would most likely get
    trials: list[Create]
    scripts: list[str]

    def render(self) -> str:
        out = [
            f"# dry run: experiment {self.experiment_id} would get {len(self.trials)} trial(s)",
            *(
                f"#   trial {c.request_id}: {json.dumps(c.hparams, sort_keys=True)}"
                for c in self.trials
            ),
        ]
        for i, script in enumerate(self.scripts, 1):
            out += ["", f"# ---- submission {i} of {len(self.scripts)} ----", script]
        return "\n".join(out)


@dataclass
class LaunchResult:
    experiment_id: int
    job_ids: list[str] = field(default_factory=list)


def _initial_trials(cfg: ExperimentConfig) -> tuple[list[Create], str]:
    searcher = searcher_of(cfg, "{}")
    slots = cfg.searcher.max_concurrent_trials or _ASK_ALL
    creates = [op for op in searcher.ask(slots) if isinstance(op, Create)]
    return creates, state_json(searcher)


def plan_launch(cfg: ExperimentConfig, home: Path, pool: SchedulerPool) -> DryRun:
    """Render the submission without writing anything (paths are the would-be ones).

    The state folder is only read, and only when its database already exists.
    """
    creates, _ = _initial_trials(cfg)
    exp_id = 1
    if (home / DB_NAME).exists():
        store = Store(home, journal_mode=cfg.site.journal_mode)
        exp_id = store.next_experiment_id()
        store.close()
    runs_root = home / "runs"
    dirs = [trial_dir(runs_root, exp_id, i + 1, cfg.slug) for i in range(len(creates))]
    exp_dir = experiment_dir(runs_root, exp_id, cfg.slug)
    request = job_request(cfg, exp_id, exp_dir, dirs, DRY_RUN_UID)
    return DryRun(exp_id, creates, pool.get(cfg.backend).render(request))


def launch(
    cfg: ExperimentConfig,
    store: Store,
    pool: SchedulerPool,
    *,
    code_from: Path | None = None,
    record: dict[str, Any] | None = None,
    prepare: Callable[[int], None] | None = None,
    yaml_text: str | None = None,
) -> LaunchResult:
    """Record the experiment and its first trials, then submit them.

    The reproducibility record (:func:`dlhpc.repro.collect_launch_record`, or
    ``record``) is collected after the snapshot and stored in ``repro_json``.
    ``code_from``: copy this snapshot instead of the workdir; ``prepare(exp_id)``
    runs once the run folder is published, before submission; ``yaml_text``:
    the YAML to keep instead of reading ``cfg.source`` (all for ``dlhpc reproduce``).

    Order matters for crash safety: the code snapshot is staged first (a failure
    there leaves the DB untouched), then one transaction records the experiment,
    its trials and the searcher state, then the run folder is published and the
    trials are submitted (see :func:`submit_pending`).
    """
    _check_limits(cfg, pool)
    creates, searcher_state = _initial_trials(cfg)
    staging = stage_run_folder(cfg, store.runs_root, code_from)
    try:
        if record is None:
            version = pool.get(cfg.backend).version_record()
            record = collect_launch_record(cfg, skip=store.runs_root, scheduler_version=version)
        with store.hold_lease():
            clock = store_clock(store)
            exp_id, exp_dir = _record_launch(
                store, cfg, creates, searcher_state, record, yaml_text, clock.now()
            )
            publish_staging(staging, cfg, exp_dir, exp_id)
            if cfg.site.permissions.mode == "group":  # jobs' checkpoint folders inherit it
                make_dirs(
                    checkpoint_experiment_dir(cfg.checkpoint.dir, exp_id, cfg.slug),
                    cfg.site.permissions,
                )
            tasks = _prepare_and_submit(store, pool, exp_id, prepare, clock)
        return LaunchResult(exp_id, [t.job_id for t in tasks])
    finally:
        remove_tree(staging, ignore_errors=True)


def _check_limits(cfg: ExperimentConfig, pool: SchedulerPool) -> None:
    """Raise ConfigError (at ``resources.time``) for a request the backend refuses for
    a site limit (e.g. above MaxWall), before anything is written."""
    problem = pool.get(cfg.backend).limit_problem(cfg.resources)
    if problem is not None:
        raise ConfigError([key_issue(cfg.source, ("resources", "time"), problem)])


def _experiment_row(
    cfg: ExperimentConfig,
    searcher_state: str,
    record: dict[str, Any],
    yaml_text: str | None,
    now: datetime,
) -> Experiment:
    """The new ACTIVE experiment's row (``run_dir`` is set once it has its id); the YAML
    kept is ``yaml_text``, or else ``cfg.source`` as it reads now."""
    return Experiment(
        name=cfg.name,
        description=cfg.description,
        state=ExperimentState.ACTIVE.value,
        backend=cfg.backend,
        site=cfg.site.name,
        searcher=cfg.searcher.name,
        metric=cfg.searcher.metric,
        smaller_is_better=cfg.searcher.smaller_is_better,
        source_path=str(cfg.source),
        yaml_text=(
            yaml_text
            if yaml_text is not None
            else cfg.source.read_text(encoding="utf-8", errors="replace")
        ),
        config_json=json.dumps(to_jsonable(cfg), sort_keys=True),
        repro_json=json.dumps(record, sort_keys=True),
        run_dir="",
        searcher_state=searcher_state,
        user=_perms.current_user(),
        created_at=now,
    )


def _record_launch(
    store: Store,
    cfg: ExperimentConfig,
    creates: list[Create],
    searcher_state: str,
    record: dict[str, Any],
    yaml_text: str | None,
    now: datetime,
) -> tuple[int, Path]:
    """One write transaction (the caller holds the lease): the experiment, its first
    trials (PENDING) and the searcher state, and a ``launch`` event, created ``now``.
    Returns the experiment's id and run folder, committed."""
    with store.write() as session:
        exp = _experiment_row(cfg, searcher_state, record, yaml_text, now)
        session.add(exp)
        session.flush()
        exp.run_dir = str(experiment_dir(store.runs_root, exp.id, cfg.slug))
        add_trials(session, exp, creates, cfg, store.runs_root, now)
        log_event(session, "launch", f"launched {cfg.name} with {len(creates)} trials", exp.id)
        exp_id, exp_dir = exp.id, Path(exp.run_dir)
    return exp_id, exp_dir


def _prepare_and_submit(
    store: Store,
    pool: SchedulerPool,
    exp_id: int,
    prepare: Callable[[int], None] | None,
    clock: Clock,
) -> list[SubmittedTask]:
    """Run ``prepare(exp_id)``, then submit the trials (:func:`submit_pending`). A
    failure of ``prepare``, or a SchedulerError that submitted no job, marks the
    experiment FAILED (a transaction of its own); every error is raised."""
    if prepare is not None:
        try:
            prepare(exp_id)
        except Exception as err:
            _fail(store, exp_id, f"preparing the run failed: {err}", clock)
            raise
    try:
        return submit_pending(store, pool, exp_id, clock)
    except SchedulerError as err:
        if not err.submitted:
            _fail(store, exp_id, f"submission failed: {err}", clock)
        raise


def _fail(store: Store, exp_id: int, message: str, clock: Clock) -> None:
    with store.write() as session:
        exp = session.get(Experiment, exp_id)
        if exp is not None:
            exp.state = ExperimentState.FAILED.value
            exp.ended_at = experiment_end(session, exp, clock.now())
            log_event(session, "experiment.failed", message, exp_id)
