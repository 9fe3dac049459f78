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
    seconds it is started again (``slurmd -N NODE``; always, in a
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

This module holds the plan and the log's records; the driver is
:mod:`tests.integration.chaos_driver`, the daemons' handling
:mod:`tests.integration.chaos_cluster`, and the campaign (launch, drive, check, and
``python -m tests.integration.chaos_campaign --long [--seed N]``)
:mod:`tests.integration.chaos_campaign`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = [
    "ACTIONS",
    "DEFAULT_SEED",
    "EXPECTED_CAUSES",
    "METRIC_NAMES",
    "PER_TRIAL",
    "STEPS_PER_EPOCH",
    "Record",
    "Step",
    "Task",
    "make_plan",
]

DEFAULT_SEED = 20240611
ACTIONS = ("preempt", "usr2", "scancel", "requeue", "kill_slurmd", "walltime")
PER_TRIAL = ("usr2", "scancel", "requeue", "walltime")
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


# -- the log -------------------------------------------------------------------


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
