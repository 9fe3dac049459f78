"""The run folder of an experiment: code snapshot, entry script, trial files.

Everything here is written by the login-node side before jobs start, with
atomic writes; jobs only read it (see :mod:`dlhpc.protocol` for the layout).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path

from dlhpc._argv_template import split_template
from dlhpc._perms import copy_file, read_only_tree, remove_tree
from dlhpc._threads import map_io
from dlhpc.config.schema import ExperimentConfig
from dlhpc.config.serde import to_jsonable
from dlhpc.errors import UsageError
from dlhpc.protocol import (
    SETUP_DONE_VAR,
    TrialSpec,
    atomic_write_text,
    checkpoint_trial_dir,
    code_dir,
    entry_script,
    experiment_dir,
    experiment_file,
    launch_env_file,
    recorded_slug,
    trial_dir,
    trial_file,
)
from dlhpc.repro import code_files

__all__ = [
    "SNAPSHOT_LIMIT_BYTES",
    "entry_runs_setup",
    "entry_script_text",
    "launch_environment",
    "publish_staging",
    "read_launch_environment",
    "setup_sections",
    "stage_run_folder",
    "trial_spec",
    "write_trial_spec",
    "write_trial_specs",
]

SNAPSHOT_LIMIT_BYTES = 200 * 1024 * 1024
# the launch's own job context (it may run inside an allocation): never a later job's
_JOB_CONTEXT = re.compile(r"^(SLURM_(?!CONF$)|SLURMD_|SRUN_|SALLOC_|PMIX?_|OMPI_)")


def snapshot_code(workdir: Path, dest: Path, skip: Path, limit: int = SNAPSHOT_LIMIT_BYTES) -> int:
    """Copy the files of :func:`dlhpc.repro.code_files` (what the record's manifest
    hashes) from ``workdir`` to ``dest``; returns bytes copied.

    Raises UsageError before copying anything when the files exceed ``limit``:
    data sets belong on scratch, referenced by path, not in the code folder.
    """
    try:
        rels, _rules = code_files(workdir, skip)
    except OSError as err:
        raise UsageError(f"cannot list the code of workdir {workdir}: {err}") from None
    files = [workdir / rel for rel in rels]
    total = sum(p.stat().st_size for p in files)
    if total > limit:
        raise UsageError(
            f"workdir {workdir} holds {total / 2**20:.0f} MiB (limit {limit / 2**20:.0f} MiB) to"
            " snapshot; move data out of it (or list it in .gitignore) and read it by path"
        )
    for rel, src in zip(rels, files, strict=True):
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        copy_file(src, target)  # the mode masked by the site's umask, not the source's
    return total


def entry_runs_setup(exp_dir: Path) -> bool:
    """Whether the experiment's ``entry.sh`` runs the site modules and
    ``environment.setup`` whatever the job script did: one written before job scripts
    ran them (launched before the setup-before-Python change, so without the
    ``DLHPC_JOB_SETUP`` check that :func:`entry_script_text` writes). Its jobs must then
    get no setup section, or the setup runs twice. False when there is no ``entry.sh``
    yet (a dry run)."""
    try:
        text = entry_script(exp_dir).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return False
    return SETUP_DONE_VAR not in text


def setup_sections(cfg: ExperimentConfig) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The shell lines a job runs before its worker: the site's modules, then the
    experiment's ``environment.setup`` (one line per element)."""
    sections: list[tuple[str, tuple[str, ...]]] = []
    if cfg.site.modules:
        sections.append(("site modules", tuple(cfg.site.modules)))
    if cfg.environment.setup.strip():
        sections.append(
            ("environment.setup", tuple(cfg.environment.setup.rstrip("\n").split("\n")))
        )
    return tuple(sections)


def launch_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment later submissions run sbatch in (jobs get it: ``--export=ALL``):
    ``environ`` without the launch's own job context (``SLURM_*`` but ``SLURM_CONF``,
    ``SRUN_*``, ``PMI*``: a launch from inside an allocation), and with ``PATH``'s
    entries that are not absolute left out (a tick starts in another folder)."""
    env = {k: v for k, v in environ.items() if not _JOB_CONTEXT.match(k)}
    if "PATH" in env:
        env["PATH"] = os.pathsep.join(e for e in env["PATH"].split(os.pathsep) if os.path.isabs(e))
    return env


def read_launch_environment(exp_dir: Path) -> dict[str, str] | None:
    """The saved launch environment of an experiment; None for one launched before it
    was saved (its jobs then get the submitting process's environment)."""
    try:
        data = json.loads(launch_env_file(exp_dir).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in data.items()
    ):
        raise UsageError(f"{launch_env_file(exp_dir)} is not a map of names to strings")
    return data


def entry_script_text(cfg: ExperimentConfig, experiment_id: int) -> str:
    lines = [
        "#!/bin/bash",
        f"# dlhpc experiment {experiment_id} ({cfg.name}): written at launch, run by the",
        "# worker in the trial's working folder ($DLHPC_TRIAL_DIR/work: links to the",
        "# read-only code snapshot). Hyperparameters are in $DLHPC_TRIAL_DIR/trial.json.",
        "",
        "# Slurm signals every process of the job (TERM at preemption, USR2 before the time",
        "# limit). The training process handles them; this shell must not die of them first.",
        "trap ':' TERM USR2 INT",
    ]
    if cfg.site.modules or cfg.environment.setup.strip():
        # a Slurm job script runs them before the worker's Python starts (set -e) and
        # says so; a backend that does not (local) gets them here, as before
        lines += ["", f'if [ "${{{SETUP_DONE_VAR}:-}}" != done ]; then']
    if cfg.site.modules:
        lines += ["", "# site modules", *cfg.site.modules]
    if cfg.environment.setup.strip():
        lines += ["", "# environment.setup", cfg.environment.setup.rstrip("\n")]
    if cfg.site.modules or cfg.environment.setup.strip():
        lines += ["fi"]
    if cfg.script.enabled:
        lines += ["", *_script_runner_lines(cfg), ""]
    else:
        lines += ["", "# entrypoint", cfg.entrypoint, ""]
    return "\n".join(lines)


def _script_runner_lines(cfg: ExperimentConfig) -> list[str]:
    """entry.sh's last lines for a plain script: dlhpc's script runner (in the worker's
    interpreter, ``$DLHPC_PYTHON``) fills the template's tokens from trial.json and runs
    the script without a shell. Only the YAML's own text is quoted here; no value is."""
    argv = ["exec", '"${DLHPC_PYTHON:-python}"', "-m", "dlhpc.integrations.script"]
    if cfg.script.metrics_pattern is not None:
        argv += ["--metrics-pattern", shlex.quote(cfg.script.metrics_pattern)]
    argv += ["--", *(shlex.quote(t) for t in split_template(cfg.entrypoint))]
    return [
        "# entrypoint (a template: {name} is filled per trial, each value one argument)",
        f"# {' '.join(cfg.entrypoint.split())}",  # one line: a newline would run as shell
        " ".join(argv),
    ]


def stage_run_folder(cfg: ExperimentConfig, runs_root: Path, code_from: Path | None = None) -> Path:
    """Build the code snapshot in a staging folder (nothing else sees it yet); remove
    it with :func:`~dlhpc._perms.remove_tree` (a copied snapshot's folders are read-only).

    ``code_from``: copy this folder (another experiment's snapshot, for ``dlhpc
    reproduce``) instead of snapshotting the workdir.
    """
    staging = runs_root / f".staging-{uuid.uuid4().hex[:12]}"
    staging.mkdir(parents=True)
    try:
        if code_from is not None:
            shutil.copytree(code_from, code_dir(staging), symlinks=True, copy_function=copy_file)
        else:
            snapshot_code(cfg.workdir, code_dir(staging), skip=runs_root)
    except BaseException:
        remove_tree(staging, ignore_errors=True)
        raise
    return staging


def publish_staging(staging: Path, cfg: ExperimentConfig, exp_dir: Path, exp_id: int) -> Path:
    """Turn the staging folder into the experiment's run folder ``exp_dir`` (as recorded
    in the database: :func:`~dlhpc.protocol.experiment_dir`) (idempotent). The code
    snapshot is made read-only (no write bit on its files and folders): trials run in
    their own working folders, and ``dlhpc reproduce`` copies the snapshot as launched."""
    if not exp_dir.exists():
        staging.rename(exp_dir)
    code_dir(exp_dir).mkdir(exist_ok=True)
    read_only_tree(code_dir(exp_dir))
    atomic_write_text(entry_script(exp_dir), entry_script_text(cfg, exp_id))
    env = launch_environment(os.environ)
    # 0600 in every permissions mode: a login shell's environment holds tokens and
    # passwords, which a lab's group mode must not share (docs/CLUSTERS.md)
    atomic_write_text(launch_env_file(exp_dir), json.dumps(env, sort_keys=True), private=True)
    atomic_write_text(
        experiment_file(exp_dir), json.dumps(to_jsonable(cfg), indent=2, sort_keys=True)
    )
    return exp_dir


def trial_spec(
    cfg: ExperimentConfig,
    runs_root: Path,
    experiment_id: int,
    trial_id: int,
    hparams: dict[str, object],
    max_length: int,
    seed: int,
    *,
    slug: str,
) -> TrialSpec:
    """The trial's ``trial.json``; ``slug``: the one in the experiment's folder names
    (:func:`~dlhpc.protocol.recorded_slug` of its recorded run folder; ``""`` for an
    experiment launched before folders had slugs), for its run and checkpoint folders."""
    exp_dir = experiment_dir(runs_root, experiment_id, slug)
    env = {**cfg.site.env, **cfg.environment.vars}
    ckpt = checkpoint_trial_dir(cfg.checkpoint.dir, experiment_id, trial_id, slug)
    return TrialSpec(
        experiment_id=experiment_id,
        trial_id=trial_id,
        hparams=dict(hparams),
        max_length=max_length,
        seed=seed,
        experiment_dir=str(exp_dir),
        code_dir=str(code_dir(exp_dir)),
        entry_script=str(entry_script(exp_dir)),
        checkpoint_dir=str(ckpt),
        metric=cfg.searcher.metric,
        smaller_is_better=cfg.searcher.smaller_is_better,
        env=env,
        keep_latest=cfg.checkpoint.keep_latest,
        deterministic=cfg.reproducibility.deterministic,
        deepspeed=cfg.deepspeed.config if cfg.deepspeed else None,
        data=[{"path": str(d.path), "hash": d.hash} for d in cfg.data],
        umask=cfg.site.permissions.umask,
    )


def write_trial_spec(spec: TrialSpec, runs_root: Path) -> Path:
    slug = recorded_slug(spec.experiment_id, spec.experiment_dir)
    tdir = trial_dir(runs_root, spec.experiment_id, spec.trial_id, slug)
    tdir.mkdir(parents=True, exist_ok=True)
    spec.write(trial_file(tdir))
    return tdir


def write_trial_specs(specs: list[TrialSpec], runs_root: Path) -> list[Path]:
    """:func:`write_trial_spec` of each, a few at a time (:func:`~dlhpc._threads.map_io`);
    the trial folders in order. The first error raises once every write has ended."""
    return map_io(lambda spec: write_trial_spec(spec, runs_root), specs)
