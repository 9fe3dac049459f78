"""A seeded chaos driver for the dev Slurm cluster (see docs/CHAOS.md).

:class:`ChaosDriver` interrupts the RUNNING array tasks of one experiment, in
between ``dlhpc tick`` calls, following a plan that :func:`make_plan` derives
from a seed alone. The actions:

``preempt``
    ``sbatch -p high -N2 --exclusive`` of a short ``sleep``: Slurm preempts
    (REQUEUE mode) every ``debug`` job, i.e. all running trials at once.
``usr2``
    ``scancel --signal=USR2`` of one task: the script checkpoints and exits 75,
    and the worker asks Slurm to requeue the task.
``scancel``
    plain ``scancel`` of one task: Slurm ends it (CANCELLED); dlhpc submits the
    trial again.
``requeue``
    ``scontrol requeue`` of one task: Slurm stops it and queues it again.
``kill_slurmd``
    SIGKILL of one node's ``slurmd`` (through its pid file), and after a few
    seconds ``scripts/dev-cluster up``, which restarts it (always, in a
    ``finally``). Running jobs survive: their ``slurmstepd`` lives on.
``walltime``
    ``scontrol update JobId=<task> EndTime=<now + lead_time + 25 s>``, which
    shortens its time limit to the second (``TimeLimit=`` takes whole minutes,
    the fallback), so that the job's ``--signal=USR2@lead_time`` comes within
    half a minute (Slurm checks time limits every 30 s): the script
    checkpoints, exits 75 and the worker requeues the task, as at a real time
    limit. Once the signal has hit, the original time limit is put back so that
    the requeued task does not time out again and again.

The plan (which action, in which order, on which trial, how long the hog sleeps
and slurmd stays down) is a pure function of the seed; the timing adapts to the
cluster: every targeted action waits until its trial's current run trains (its
``progress.json`` was written after Slurm started the task), has work left, and
was not hit before. Each plan covers every action type at least once per round.
Every action lands in :attr:`ChaosDriver.records`, with its time and target.

:func:`run_campaign` launches the digits example, drives the chaos and ticks
until the experiment ends; :func:`check_campaign` asserts what must hold after
it (see its docstring). Run as a script for a longer campaign::

    python -m tests.integration.chaos --long [--seed N]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from dlhpc.protocol import HEARTBEAT_FILE, PROGRESS_FILE, read_event_batches, read_small_json
from tests.integration._reference import (
    DIGITS,
    PLANNED_EXIT_NOISE,
    SELF_REQUEUE_NOISE,
    References,
    final_sha,
    hog_argv,
    logs_of,
    seed_of,
    start_references,
)
from tests.integration.conftest import REPO, Cli

__all__ = [
    "ACTIONS",
    "DEFAULT_SEED",
    "EXPECTED_CAUSES",
    "CampaignConfig",
    "CampaignResult",
    "ChaosDriver",
    "Record",
    "Step",
    "check_campaign",
    "cluster_healthy",
    "kill_slurmd",
    "make_plan",
    "restore_cluster",
    "run_campaign",
]

DEFAULT_SEED = 20240611
ACTIONS = ("preempt", "usr2", "scancel", "requeue", "kill_slurmd", "walltime")
PER_TRIAL = ("usr2", "scancel", "requeue", "walltime")
DEV_CLUSTER = REPO / "scripts" / "dev-cluster"
STEPS_PER_EPOCH = 23  # digits: 1437 training images in batches of 64
METRIC_NAMES = {"train_loss", "val_loss", "val_accuracy"}

#: The causes dlhpc may record on the attempt an action hit (status JSON).
EXPECTED_CAUSES: dict[str, set[str]] = {
    "preempt": {"preempted", "requeued"},
    "usr2": {"timeout"},  # dlhpc cannot tell a hand-sent USR2 from the time limit's
    "scancel": {"cancelled"},
    "requeue": {"requeued"},
    "walltime": {"timeout"},
}

#: The actions whose hit run asks Slurm itself to requeue its task (USR2: exit 75, then
#: the worker's ``scontrol requeue``, which kills the step it runs in).
SELF_REQUEUED = ("usr2", "walltime")


# -- the plan ------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One planned action. ``trial`` is an ordinal among the experiment's trials
    (sorted by id), None for the actions that hit a node or all trials; ``pick``
    chooses among candidates (the node); ``delay_s`` is waited once the target
    trains; ``hold_s`` is how long the hog sleeps or slurmd stays down."""

    kind: str
    trial: int | None
    pick: float
    delay_s: float
    hold_s: float


def make_plan(seed: int, n_trials: int, rounds: int = 1) -> list[Step]:
    """The actions of a run, a pure function of the arguments.

    Each round starts with ``walltime`` (its signal needs half a minute of
    training left, so it goes to a trial early in its run), followed by the other five
    actions in a seeded order; the per-trial actions go to the trials in a
    seeded rotation, so every trial is hit.
    """
    if n_trials < 1 or rounds < 1:
        raise ValueError("need at least one trial and one round")
    rng = random.Random(seed)
    steps: list[Step] = []
    for _ in range(rounds):
        order = rng.sample(range(n_trials), n_trials)
        rest = ["preempt", "usr2", "scancel", "requeue", "kill_slurmd"]
        rng.shuffle(rest)
        n = 0
        for kind in ["walltime", *rest]:
            trial = None
            if kind in PER_TRIAL:
                trial, n = order[n % n_trials], n + 1
            hold = rng.uniform(8.0, 14.0) if kind == "preempt" else rng.uniform(3.0, 6.0)
            steps.append(Step(kind, trial, rng.random(), rng.uniform(0.5, 3.0), round(hold, 1)))
    return steps


# -- the dev cluster -------------------------------------------------------------


def _state_dir(env: Mapping[str, str]) -> Path:
    if env.get("SLURM_CONF"):
        return Path(env["SLURM_CONF"]).parent
    return Path(env.get("DLHPC_DEV_CLUSTER_DIR", "/var/tmp/dlhpc-dev-cluster"))


def _dev_cluster(command: str, env: Mapping[str, str]) -> list[str]:
    """``scripts/dev-cluster COMMAND`` for the cluster ``env`` names (``dev-cluster env``
    exports its version and profile): without them ``up`` would start another cluster."""
    argv = [str(DEV_CLUSTER), command]
    for flag, var in (("--slurm", "DLHPC_DEV_SLURM"), ("--profile", "DLHPC_DEV_PROFILE")):
        if env.get(var):
            argv += [flag, env[var]]
    return argv


def _pid_alive(pid: int, comm: str) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == comm and not Path(
            f"/proc/{pid}/stat"
        ).read_text().split(") ", 1)[1].startswith("Z")
    except (OSError, IndexError):
        return False


def kill_slurmd(env: Mapping[str, str], node: str) -> int:
    """SIGKILL the ``slurmd`` of ``node`` (found through its pid file); its pid.

    Refuses a pid that is not a live ``slurmd`` (a stale pid file, a recycled pid).
    """
    pidfile = _state_dir(env) / "run" / f"slurmd-{node}.pid"
    pid = int(pidfile.read_text().split()[0])
    if not _pid_alive(pid, "slurmd"):
        raise RuntimeError(f"{pidfile} names pid {pid}, which is not a live slurmd")
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while _pid_alive(pid, "slurmd"):
        if time.monotonic() > deadline:
            raise RuntimeError(f"slurmd {node} (pid {pid}) survived SIGKILL")
        time.sleep(0.1)
    return pid


def cluster_healthy(env: Mapping[str, str]) -> bool:
    """All daemons run and no node is down or drained (``scripts/dev-cluster status``)."""
    status = subprocess.run(
        _dev_cluster("status", env), env=dict(env), capture_output=True, text=True, check=False
    )
    if status.returncode != 0:
        return False
    nodes = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%T"], env=dict(env), capture_output=True, text=True
    )
    bad = ("down", "drain", "fail", "not_responding", "unknown")
    return nodes.returncode == 0 and not any(
        any(b in s for b in bad) for s in nodes.stdout.lower().split()
    )


def restore_cluster(env: Mapping[str, str], attempts: int = 3) -> str:
    """``scripts/dev-cluster up`` (idempotent: restarts dead daemons, resumes down
    nodes) until the cluster is healthy; returns its stderr tail. Raises if it
    stays broken."""
    tail = ""
    for _ in range(attempts):
        proc = subprocess.run(
            _dev_cluster("up", env),
            env=dict(env),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        tail = "\n".join(proc.stderr.strip().splitlines()[-3:])
        if proc.returncode == 0 and cluster_healthy(env):
            return tail
        time.sleep(2)
    raise RuntimeError(f"scripts/dev-cluster up did not restore the cluster:\n{tail}")


# -- the driver -----------------------------------------------------------------


@dataclass(frozen=True)
class Task:
    """A RUNNING array task of the experiment, as squeue and its files show it."""

    job_id: str
    trial_id: int
    node: str
    start: float  # epoch seconds
    limit: str  # squeue's %l
    attempt_key: str | None  # its newest attempt folder
    step: int | None  # progress.json's step, if written since Slurm started the task


@dataclass
class Record:
    """One line of the chaos log."""

    t: float  # seconds since the driver started
    kind: str
    target: str  # job id, node, hog job id
    trial_id: int | None = None
    attempt_key: str | None = None
    detail: str = ""

    def __str__(self) -> str:
        who = f" trial {self.trial_id}" if self.trial_id is not None else ""
        key = f" [{self.attempt_key}]" if self.attempt_key else ""
        return f"{self.t:7.1f}s {self.kind:<14} {self.target}{who}{key} {self.detail}".rstrip()


@dataclass
class _Armed:
    job_id: str
    attempt_key: str
    limit: str


class ChaosDriver:
    """Applies :func:`make_plan`'s actions to an experiment's running tasks.

    ``job_ids_fn`` returns the Slurm task ids of the experiment's unfinished
    trials, each mapped to its trial id (the driver uses it every poll).
    ``run_dir`` is the experiment's run folder (for ``progress.json``);
    ``tick_fn`` is called every ``tick_every_s`` while the driver waits.
    Targets keep ``min_steps_left`` steps of ``total_steps`` to train, so an
    action never races a trial's natural end.
    """

    def __init__(
        self,
        seed: int,
        env: Mapping[str, str],
        job_ids_fn: Callable[[], Mapping[str, int]],
        *,
        run_dir: Path,
        tick_fn: Callable[[], None] = lambda: None,
        n_trials: int = 3,
        rounds: int = 1,
        total_steps: int | None = None,
        min_steps_left: int = 25,
        lead_time_s: int = 60,
        tick_every_s: float = 2.0,
        step_timeout_s: float = 240.0,
        patience_s: float = 45.0,
        echo: bool = False,
    ) -> None:
        self.seed = seed
        self.env = {**env, "SLURM_TIME_FORMAT": "standard"}
        self.job_ids_fn = job_ids_fn
        self.run_dir = run_dir
        self.tick_fn = tick_fn
        self.plan = make_plan(seed, n_trials, rounds)
        self.total_steps = total_steps
        self.min_steps_left = min_steps_left
        self.lead_time_s = lead_time_s
        self.tick_every_s = tick_every_s
        self.step_timeout_s = step_timeout_s
        self.patience_s = patience_s
        self.echo = echo
        self.records: list[Record] = []
        self.hit: set[str] = set()  # attempt keys already interrupted
        self.armed: dict[int, _Armed] = {}
        self.trial_ids: list[int] = []  # sorted; ordinals index it
        self._t0 = time.monotonic()
        self._last_tick = 0.0

    # -- log ------------------------------------------------------------------

    def log(self, kind: str, target: str, trial_id: int | None = None, **kw: Any) -> Record:
        rec = Record(round(time.monotonic() - self._t0, 1), kind, target, trial_id, **kw)
        self.records.append(rec)
        if self.echo:
            print(rec, flush=True)
        return rec

    def plan_text(self) -> str:
        """``walltime(#2), preempt, ...``: the plan, trials as ordinals."""
        return ", ".join(
            s.kind + (f"(#{s.trial})" if s.trial is not None else "") for s in self.plan
        )

    def format_log(self) -> str:
        """The plan and every record, one per line (printed when a check fails)."""
        head = f"chaos seed {self.seed}; plan: {self.plan_text()}"
        return "\n".join([head, *(str(r) for r in self.records)])

    # -- commands -------------------------------------------------------------

    def _cmd(self, *args: str, timeout: float = 60) -> tuple[int, str]:
        try:
            proc = subprocess.run(
                list(args), env=self.env, capture_output=True, text=True, timeout=timeout
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            return -1, str(err)
        return proc.returncode, " ".join((proc.stdout + proc.stderr).split())[:300]

    def _tick(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._last_tick >= self.tick_every_s:
            self._last_tick = now
            self.tick_fn()

    def _sleep(self, seconds: float) -> None:
        """Sleep, ticking meanwhile."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            self._tick()
            time.sleep(min(0.5, max(0.0, left)))

    # -- what runs --------------------------------------------------------------

    def _attempt(self, trial_id: int, job_id: str, start: float) -> tuple[str | None, int | None]:
        adir = self.run_dir / "trials" / f"trial-{trial_id:06d}" / "attempts"
        best: tuple[int, Path] | None = None
        with contextlib.suppress(OSError):
            for p in adir.iterdir():
                head, sep, restart = p.name.rpartition(".r")
                ok = sep and head == job_id and restart.isdigit()
                if ok and (best is None or int(restart) > best[0]):
                    best = (int(restart), p)
        if best is None:
            return None, None
        progress = read_small_json(best[1] / PROGRESS_FILE) or {}
        when, step = progress.get("time"), progress.get("step")
        if isinstance(when, int | float) and when >= start - 1 and isinstance(step, int):
            return best[1].name, step
        return best[1].name, None

    def tasks(self) -> list[Task]:
        """The experiment's RUNNING tasks (one squeue, a few small file reads)."""
        jobs = dict(self.job_ids_fn())
        if not self.trial_ids and jobs:
            self.trial_ids = sorted(set(jobs.values()))
        proc = subprocess.run(
            ["squeue", "-h", "-r", "-t", "RUNNING", "-o", "%i|%S|%N|%l"],
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        if proc.returncode != 0:
            return []
        out = []
        for line in proc.stdout.splitlines():
            job_id, start_s, node, limit = (line.split("|") + ["", "", "", ""])[:4]
            if job_id not in jobs:
                continue
            try:
                start = datetime.fromisoformat(start_s).timestamp()
            except ValueError:
                continue
            key, step = self._attempt(jobs[job_id], job_id, start)
            out.append(Task(job_id, jobs[job_id], node, start, limit, key, step))
        return sorted(out, key=lambda t: self._ordinal(t.trial_id))

    def _ordinal(self, trial_id: int) -> int:
        return self.trial_ids.index(trial_id) if trial_id in self.trial_ids else len(self.trial_ids)

    def training(self, t: Task, left: int | None = None) -> bool:
        """Mid-training: its current run stepped, was not hit yet, and has ``left``
        (default ``min_steps_left``) steps to go."""
        if t.step is None or t.attempt_key is None or t.attempt_key in self.hit:
            return False
        left = self.min_steps_left if left is None else left
        return self.total_steps is None or t.step <= self.total_steps - left

    def _watch_armed(self, tasks: list[Task]) -> None:
        """Notice walltime targets whose signal hit (their run ended); restore the limit."""
        running = {t.trial_id: t for t in tasks}
        live = set(self.job_ids_fn().values())
        for trial_id, armed in list(self.armed.items()):
            t = running.get(trial_id)
            if t is not None and t.job_id == armed.job_id and t.attempt_key == armed.attempt_key:
                continue
            del self.armed[trial_id]
            if trial_id not in live:
                self.log("walltime-missed", armed.job_id, trial_id, detail="trial ended first")
                continue
            rc, out = self._cmd(
                "scontrol", "update", f"JobId={armed.job_id}", f"TimeLimit={armed.limit}"
            )
            self.log(
                "walltime-fired",
                armed.job_id,
                trial_id,
                attempt_key=armed.attempt_key,
                detail=f"run ended; TimeLimit back to {armed.limit} (rc {rc}) {out}".strip(),
            )

    def _wait(self, what: str, pick: Callable[[list[Task]], Any]) -> Any:
        """Poll (ticking) until ``pick(tasks)`` is truthy; returns it."""
        deadline = time.monotonic() + self.step_timeout_s
        while True:
            tasks = self.tasks()
            self._watch_armed(tasks)
            got = pick(tasks)
            if got:
                return got
            if self.trial_ids and not self.job_ids_fn():
                raise TimeoutError(f"chaos: every trial ended before {what}\n{self.format_log()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"chaos: gave up waiting for {what}\n{self.format_log()}")
            self._tick()
            time.sleep(0.5)

    # -- the actions ------------------------------------------------------------

    def _target(self, step: Step, waited_since: float) -> Callable[[list[Task]], Task | None]:
        def pick(tasks: list[Task]) -> Task | None:
            live = set(self.job_ids_fn().values())
            # the walltime signal comes up to ~35 s after the update: keep 4x the margin
            left = self.min_steps_left * (4 if step.kind == "walltime" else 1)
            ok = [t for t in tasks if self.training(t, left) and t.trial_id not in self.armed]
            planned = self.trial_ids[step.trial] if step.trial is not None else None
            for t in ok:
                if t.trial_id == planned:
                    return t
            # the planned trial finished, or is stuck behind something: take the next one
            if planned not in live or time.monotonic() - waited_since > self.patience_s:
                n = len(self.trial_ids)
                ring = [self.trial_ids[((step.trial or 0) + i) % n] for i in range(1, n + 1)]
                for trial_id in ring:
                    for t in ok:
                        if t.trial_id == trial_id:
                            return t
            return None

        return pick

    def _do_trial_action(self, step: Step) -> None:
        task: Task = self._wait(f"{step.kind} target", self._target(step, time.monotonic()))
        self._sleep(step.delay_s)
        assert task.attempt_key is not None
        if step.kind == "walltime":
            # EndTime shortens the time limit to the second (TimeLimit= takes whole
            # minutes); lead + 25 s left: Slurm's 30 s time-limit check sends the
            # USR2@lead signal within half a minute.
            elapsed = time.time() - task.start
            end = datetime.fromtimestamp(time.time() + self.lead_time_s + 25)
            cmd = ["scontrol", "update", f"JobId={task.job_id}", f"EndTime={end:%Y-%m-%dT%H:%M:%S}"]
            self.armed[task.trial_id] = _Armed(task.job_id, task.attempt_key, task.limit)
            extra = f" (elapsed {elapsed:.0f}s, limit was {task.limit})"
        elif step.kind == "usr2":
            cmd, extra = ["scancel", "--signal=USR2", task.job_id], ""
        elif step.kind == "scancel":
            cmd, extra = ["scancel", task.job_id], ""
        elif step.kind == "requeue":
            cmd, extra = ["scontrol", "requeue", task.job_id], ""
        else:
            raise ValueError(step.kind)
        rc, out = self._cmd(*cmd)
        if rc != 0 and step.kind == "walltime":  # whole minutes, then
            minutes = math.ceil((elapsed + self.lead_time_s + 15) / 60)
            cmd = ["scontrol", "update", f"JobId={task.job_id}", f"TimeLimit={minutes}"]
            rc, out = self._cmd(*cmd)
        self.hit.add(task.attempt_key)
        self.log(
            step.kind,
            task.job_id,
            task.trial_id,
            attempt_key=task.attempt_key,
            detail=f"step {task.step} on {task.node}: {' '.join(cmd)} -> rc {rc}{extra} {out}",
        )
        if rc != 0:
            self.armed.pop(task.trial_id, None)

    def _do_preempt(self, step: Step) -> None:
        first: list[float] = []  # when a first target trained

        def pick(tasks: list[Task]) -> list[Task]:
            if self.armed:
                return []  # let the walltime signal hit first
            live = set(self.job_ids_fn().values())
            ok = [t for t in tasks if self.training(t)]
            if not ok:
                return []
            first[:] = first or [time.monotonic()]
            if {t.trial_id for t in ok} >= live:
                return ok
            # the others are starting (or queued): hit them in their startup, as it comes
            return ok if time.monotonic() - first[0] > self.patience_s / 3 else []

        targets: list[Task] = self._wait("preemption targets", pick)
        self._sleep(step.delay_s)
        sleep = int(step.hold_s)
        rc, out = self._cmd(*hog_argv(sleep))
        self.log("hog", out if rc == 0 else "-", detail=f"sbatch -p high sleep {sleep} -> rc {rc}")
        if rc != 0:
            return
        for t in targets:
            self.hit.add(t.attempt_key or "")
            self.log(
                "preempt", t.job_id, t.trial_id, attempt_key=t.attempt_key, detail=f"by hog {out}"
            )
        hit = {t.job_id for t in targets}
        others = [t.job_id for t in self.tasks() if t.job_id not in hit]
        if others:
            self.log("preempt-also", ",".join(others), detail="running, not yet training")

    def _settling(self) -> list[str]:
        """The experiment's tasks that Slurm is still ending (COMPLETING, or a hit run
        still RUNNING): their epilog needs the node's slurmd."""
        jobs = self.job_ids_fn()
        proc = subprocess.run(
            ["squeue", "-h", "-r", "-t", "CG,SO", "-o", "%i"],
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        ending = [j for j in proc.stdout.split() if j in jobs]
        return ending + [t.job_id for t in self.tasks() if t.attempt_key in self.hit]

    def _do_kill_slurmd(self, step: Step) -> None:
        # Not while a job ends: killed then, slurmd never reports the epilog, and
        # Slurm holds the job COMPLETING until it resends the terminate (~85 s).
        tasks: list[Task] = self._wait(
            "a training task for kill_slurmd, nothing ending",
            lambda ts: [t for t in ts if self.training(t)] if not self._settling() else [],
        )
        nodes = sorted({t.node for t in tasks})
        node = nodes[int(step.pick * len(nodes))]
        try:
            pid = kill_slurmd(self.env, node)
            on = [t.attempt_key for t in tasks if t.node == node]
            self.log("kill_slurmd", node, detail=f"SIGKILL pid {pid}; running there: {on}")
            self._sleep(step.hold_s)
        finally:
            t0 = time.monotonic()
            tail = restore_cluster(self.env)
            self.log(
                "slurmd-restored",
                node,
                detail=f"dev-cluster up after {step.hold_s}s down, took "
                f"{time.monotonic() - t0:.1f}s: {tail.splitlines()[-1] if tail else ''}",
            )

    def run(self) -> list[Record]:
        """Apply the whole plan; returns once every walltime signal has hit."""
        self._t0 = time.monotonic()
        self.log("plan", f"seed {self.seed}", detail=self.plan_text())
        for step in self.plan:
            if step.kind == "preempt":
                self._do_preempt(step)
            elif step.kind == "kill_slurmd":
                self._do_kill_slurmd(step)
            else:
                self._do_trial_action(step)
        self._wait("the walltime signal", lambda _ts: not self.armed)
        self.log("done", "-")
        return self.records


# -- a campaign: the digits example under chaos -----------------------------------


@dataclass(frozen=True)
class CampaignConfig:
    """A chaos run of the digits example. The defaults: about 80 s per trial
    uninterrupted (8 epochs of 23 steps, 0.4 s each), one round of the six actions."""

    seed: int = DEFAULT_SEED
    trials: int = 3
    epochs: int = 8
    step_sleep: float = 0.4
    rounds: int = 1
    lead_time_s: int = 60
    timeout_s: float = 300.0  # after the driver is done, for the trials to finish
    echo: bool = False

    @property
    def total_steps(self) -> int:
        return self.epochs * STEPS_PER_EPOCH


@dataclass
class CampaignResult:
    exp_id: int
    exp: dict[str, Any]
    driver: ChaosDriver
    seconds: float
    workdir: Path
    references: References
    notes: list[str] = field(default_factory=list)


def experiment_yaml(workdir: Path, cfg: CampaignConfig) -> Path:
    lr = f"{{type: log, minval: -2, maxval: -1, count: {cfg.trials}}}"
    exp = workdir / f"chaos-{cfg.seed}.yaml"
    exp.write_text(
        f"name: chaos-{cfg.seed}\nentrypoint: python train.py\nworkdir: {DIGITS}\n"
        "resources: {cpus_per_task: 1, mem: 1G, time: '00:10:00'}\n"
        "hyperparameters:\n"
        f"  lr: {lr}\n"
        "  hidden: 32\n  dropout: 0.2\n  batch_size: 64\n"
        f"  step_sleep: {cfg.step_sleep}\n"
        "searcher: {name: grid, metric: val_accuracy, smaller_is_better: false, "
        f"max_length: {cfg.epochs}}}\n"
        "reproducibility: {seed: 7, deterministic: true}\n"
        f"preemption: {{lead_time: '{cfg.lead_time_s}s'}}\n"
        "max_restarts: 2\n"
    )
    return exp


def _ro(db: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)


def live_job_ids(db: Path, exp_id: int) -> dict[str, int]:
    """Task id -> trial id of the experiment's unfinished trials (read-only, no CLI;
    a tick's write lock is waited out)."""
    con = _ro(db)
    try:
        rows = con.execute(
            "SELECT a.job_id, t.id FROM attempts a JOIN trials t ON a.trial_id = t.id"
            " WHERE t.experiment_id = ? AND t.state NOT IN"
            " ('COMPLETED', 'STOPPED_EARLY', 'FAILED', 'KILLED')",
            (exp_id,),
        ).fetchall()
    finally:
        con.close()
    return {str(j): int(t) for j, t in rows}


def run_campaign(cli: Cli, workdir: Path, cfg: CampaignConfig) -> CampaignResult:
    """Launch, drive the chaos while ticking, tick until the experiment ends.

    Whatever happens, the hog jobs and the experiment's jobs are cancelled
    afterwards if still queued, and the cluster is restored if a daemon is down.
    """
    t0 = time.monotonic()
    exp_id = int(cli.json("launch", str(experiment_yaml(workdir, cfg)))["experiment_id"])
    launched = cli.experiment(exp_id)
    run_dir = Path(launched["run_dir"])
    # the uninterrupted references train meanwhile, at a lower priority
    seeds = {t["id"]: seed_of(cli, t["id"]) for t in launched["trials"]}
    refs = start_references(workdir, launched["trials"], cfg.epochs, seeds, niceness=10)
    db = cli.home / "dlhpc.db"

    def tick() -> None:
        cli("tick", "-q")

    driver = ChaosDriver(
        cfg.seed,
        cli.env,
        lambda: live_job_ids(db, exp_id),
        run_dir=run_dir,
        tick_fn=tick,
        n_trials=cfg.trials,
        rounds=cfg.rounds,
        total_steps=cfg.total_steps,
        lead_time_s=cfg.lead_time_s,
        echo=cfg.echo,
    )
    try:
        driver.run()
        exp = cli.tick_until(
            exp_id, lambda e: e["state"] not in ("ACTIVE", "PAUSED"), timeout=cfg.timeout_s
        )
    except Exception as err:
        raise AssertionError(f"{err}\n{driver.format_log()}") from err
    finally:
        with contextlib.suppress(Exception):  # leave nothing of ours queued
            left = list(live_job_ids(db, exp_id))
            left += [r.target for r in driver.records if r.kind == "hog" and r.target != "-"]
            subprocess.run(["scancel", *left], env=cli.env, capture_output=True, timeout=60)
        if not cluster_healthy(cli.env):
            driver.log("restore", "cluster", detail=restore_cluster(cli.env))
    return CampaignResult(exp_id, exp, driver, time.monotonic() - t0, workdir, refs)


def _attempt_files(run_dir: Path, trial_id: int) -> dict[str, tuple[list[dict[str, Any]], Path]]:
    adir = run_dir / "trials" / f"trial-{trial_id:06d}" / "attempts"
    out = {}
    for p in sorted(adir.iterdir()):
        records = [r for b in read_event_batches(p) for r in b.records]
        out[p.name] = (records, p)
    return out


def _sacct_states(env: Mapping[str, str], job_id: str) -> list[str]:
    proc = subprocess.run(
        ["sacct", "-D", "-X", "-n", "-P", "-j", job_id, "-o", "JobID,State"],
        env=dict(env),
        capture_output=True,
        text=True,
        check=False,
    )
    return [line.split("|")[1].split()[0] for line in proc.stdout.splitlines() if "|" in line]


def check_campaign(cli: Cli, result: CampaignResult, cfg: CampaignConfig) -> None:
    """Assert what must hold after a chaos run (AssertionErrors carry the chaos log).

    * every action type hit at least once per round, the hog preempted at least
      one running trial, and the walltime signal came before the trial's end;
    * the experiment and every trial are COMPLETED, with ``steps_completed`` ==
      ``max_length`` and ``crashes == 0`` (chaos is never the trial's fault);
    * each attempt an action hit ended with a cause in :data:`EXPECTED_CAUSES`
      and a later attempt of that trial exists (restarts are recorded); the
      walltime target's attempt exited on USR2 and sacct shows its task TIMEOUT
      or REQUEUED;
    * no two attempts of a trial ran at the same time (from the workers' start
      and exit records, heartbeats and progress files);
    * the final weights equal those of an uninterrupted plain-process run;
    * metrics exactly once: ``trials x epochs x 3`` rows, steps 1..E per trial,
      and any epoch an attempt reported twice has identical values;
    * ``PRAGMA integrity_check`` is ok.
    """
    log = result.driver.format_log()
    exp = result.exp

    def need(ok: object, what: str) -> None:
        if not ok:
            raise AssertionError(
                f"{what}\n--- chaos log ---\n{log}\n--- status ---\n{json.dumps(exp, indent=1)}"
            )

    records = result.driver.records
    counts: dict[str, int] = defaultdict(int)
    for r in records:
        counts[r.kind] += 1
    for kind in ACTIONS:
        need(counts[kind] >= cfg.rounds, f"action {kind} hit {counts[kind]} time(s)")
    need(counts["hog"] >= cfg.rounds, "no hog was submitted")
    need(counts["walltime-fired"] >= cfg.rounds, "the walltime signal never hit")
    need(exp["state"] == "COMPLETED", f"experiment {exp['state']}")
    trials = {t["id"]: t for t in exp["trials"]}
    need(len(trials) == cfg.trials, f"{len(trials)} trials, expected {cfg.trials}")
    for t in trials.values():
        need(t["state"] == "COMPLETED", f"trial {t['id']} {t['state']}")
        need(t["steps_completed"] == cfg.epochs, f"trial {t['id']} steps {t['steps_completed']}")
        need(t["crashes"] == 0, f"trial {t['id']} counted {t['crashes']} crash(es)")
        need(t["restarts"] == len(t["attempts"]) - 1, f"trial {t['id']} restarts mismatch")

    # causes of the attempts the actions hit
    con = _ro(cli.home / "dlhpc.db")
    try:
        exit_reason = dict(
            con.execute(
                "SELECT trial_id || ':' || attempt_key, exit_reason FROM attempts"
            ).fetchall()
        )
        rows = con.execute(
            "SELECT m.trial_id, m.step, m.name FROM metrics m JOIN trials t ON m.trial_id = t.id"
            " WHERE t.experiment_id = ?",
            (result.exp_id,),
        ).fetchall()
        integrity = con.execute("PRAGMA integrity_check").fetchone()
    finally:
        con.close()
    for r in records:
        if r.kind not in EXPECTED_CAUSES or r.trial_id is None:
            continue
        t = trials[r.trial_id]
        keys = [a["key"] for a in t["attempts"]]
        need(r.attempt_key in keys, f"{r.kind}: attempt {r.attempt_key} unknown to dlhpc")
        i = keys.index(r.attempt_key)
        cause = t["attempts"][i]["cause"]
        need(
            cause in EXPECTED_CAUSES[r.kind],
            f"{r.kind} of {r.attempt_key}: cause {cause!r}, expected {EXPECTED_CAUSES[r.kind]}",
        )
        need(i < len(keys) - 1, f"{r.kind} of {r.attempt_key}: no later attempt")
        if r.kind == "walltime":
            reason = exit_reason.get(f"{r.trial_id}:{r.attempt_key}") or ""
            need("USR2" in reason, f"walltime of {r.attempt_key}: exit reason {reason!r}")
            states = _sacct_states(cli.env, r.target)
            need(
                {"TIMEOUT", "REQUEUED"} & set(states),
                f"walltime of {r.target}: sacct shows {states}",
            )
            result.notes.append(f"walltime {r.target}: sacct {states}, exit {reason}")

    # one run of a trial at a time; re-reported epochs agree
    run_dir = Path(exp["run_dir"])
    for trial_id in trials:
        spans = []
        values: dict[tuple[int, str], set[float | None]] = defaultdict(set)
        for key, (recs, path) in _attempt_files(run_dir, trial_id).items():
            start = [ev["time"] for ev in recs if ev.get("type") == "start"]
            end = [ev["time"] for ev in recs if ev.get("type") == "exit"]
            last = max([ev["time"] for ev in recs] or [0.0])
            for name in (HEARTBEAT_FILE, PROGRESS_FILE):
                last = max(last, float((read_small_json(path / name) or {}).get("time", 0.0)))
            if start:
                spans.append((min(start), end[0] if end else last, key))
            for ev in recs:
                if ev.get("type") == "metric":
                    for name, value in ev["metrics"].items():
                        values[(ev["step"], name)].add(value)
        spans.sort()
        for (_s1, e1, k1), (s2, _e2, k2) in zip(spans, spans[1:], strict=False):
            need(e1 <= s2 + 0.5, f"trial {trial_id}: {k1} still ran when {k2} started")
        twice = {k: v for k, v in values.items() if len(v) > 1}
        need(not twice, f"trial {trial_id}: an epoch re-reported with other values: {twice}")

    # exactly once, no gap
    need(len(rows) == len(set(rows)) == cfg.trials * cfg.epochs * 3, f"{len(rows)} metric rows")
    for trial_id in trials:
        steps = {s for tid, s, _n in rows if tid == trial_id}
        names = {n for tid, _s, n in rows if tid == trial_id}
        need(steps == set(range(1, cfg.epochs + 1)), f"trial {trial_id}: metric steps {steps}")
        need(names == METRIC_NAMES, f"trial {trial_id}: metric names {names}")
    need(integrity == ("ok",), f"integrity_check: {integrity}")

    _check_logs(cli, result, trials, need)

    # bitwise equal to the uninterrupted runs
    refs = result.references.wait()
    for tid in trials:
        got = final_sha(cli, result.exp_id, tid)
        need(got == refs[tid], f"trial {tid}: final weights {got} != reference {refs[tid]}")


def _check_logs(
    cli: Cli,
    result: CampaignResult,
    trials: Mapping[int, dict[str, Any]],
    need: Callable[[object, str], None],
) -> None:
    """``dlhpc logs`` after each action: the attempt after the one it hit prints the
    script's resume (Slurm's requeue under the same id: the same log as the hit run; a
    resubmission: the new job's); the hit attempt's stderr shows no traceback and no srun
    error when every run of its job ended as planned (exit 75 or 0; in the log of a task
    that requeued itself, srun's report of the step that requeue killed is allowed, see
    SELF_REQUEUE_NOISE); and each trial's latest log ends with its final weights. Every
    problem is listed, not just the first."""
    problems = []
    self_requeued = {  # one log holds every run of a task: these jobs' logs hold srun's kill
        r.target for r in result.driver.records if r.kind in SELF_REQUEUED
    }
    for r in result.driver.records:
        if r.kind not in EXPECTED_CAUSES or r.trial_id is None or r.attempt_key is None:
            continue
        attempts = trials[r.trial_id]["attempts"]
        i = [a["key"] for a in attempts].index(r.attempt_key)
        after = attempts[i + 1]["key"]
        out, _ = _logs_or_error(cli, r.trial_id, after)
        if "resumed at epoch" not in out:
            problems.append(f"{r.kind}: dlhpc logs of {after} has no resume:\n{out}")
        job = attempts[i]["job_id"]
        if all(a["exit_code"] in (0, 75) for a in attempts if a["job_id"] == job):
            _, err = _logs_or_error(cli, r.trial_id, r.attempt_key)
            unwanted = SELF_REQUEUE_NOISE if job in self_requeued else PLANNED_EXIT_NOISE
            if noise := [x for x in unwanted if x in err]:
                problems.append(f"{r.kind}: the log of {r.attempt_key} shows {noise}:\n{err}")
    for tid in trials:
        out, _ = _logs_or_error(cli, tid)
        sha = final_sha(cli, result.exp_id, tid)
        if f"weights_sha256={sha}" not in out:
            problems.append(f"trial {tid}: dlhpc logs lacks its final weights:\n{out}")
    need(not problems, "\n".join(problems))


def _logs_or_error(cli: Cli, trial_id: int, key: str | None = None) -> tuple[str, str]:
    """:func:`logs_of`, or its failure's message as both streams (then checked as text)."""
    try:
        return logs_of(cli, trial_id, key)
    except AssertionError as err:
        return str(err), str(err)


@contextlib.contextmanager
def _workdir(keep: bool) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="dlhpc-chaos-"))
    try:
        yield path
    finally:
        if not keep:
            from dlhpc._perms import remove_tree

            remove_tree(path, ignore_errors=True)  # it holds read-only code snapshots


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.integration.chaos [--long] [--seed N] [--keep]``."""
    from tests.integration.conftest import _slurm_env

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ap.add_argument("--long", action="store_true", help="4 trials, 30 epochs, 3 rounds (~12 min)")
    ap.add_argument("--keep", action="store_true", help="keep the temp folder (DLHPC_HOME)")
    args = ap.parse_args(argv)
    env = _slurm_env()
    if env is None:
        print("dev cluster not running (scripts/dev-cluster up)", file=sys.stderr)
        return 2
    cfg = CampaignConfig(seed=args.seed, echo=True)
    if args.long:
        cfg = CampaignConfig(
            seed=args.seed, trials=4, epochs=30, rounds=3, timeout_s=900, echo=True
        )
    with _workdir(args.keep) as workdir:
        cli = Cli(env, workdir / "home")
        print(f"chaos campaign {cfg} in {workdir}", flush=True)
        try:
            result = run_campaign(cli, workdir, cfg)
            check_campaign(cli, result, cfg)
        except AssertionError as err:
            print(f"FAILED: {err}", file=sys.stderr)
            return 1
        print("\n".join(result.notes))
        print(f"PASSED in {result.seconds:.0f}s (seed {cfg.seed})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
