"""The infrastructure faults of the second chaos campaign (see docs/CHAOS.md), a
seeded plan of them, and the driver that applies it while the login nodes' loops
(:mod:`tests.integration.chaos_ticker`) reconcile. The faults:

``ctld_outage``
    ``slurmctld`` stopped (SIGTERM, through its pid file) until the login nodes
    have finished two reconciling passes that started after the stop (each waits
    out squeue's retries, about 10 s), and at least the planned hold; then started again
    (:func:`~tests.integration.chaos_cluster.restore_cluster`).
``ctld_restart``
    ``slurmctld`` stopped and started again at once, while jobs train.
``dbd_outage``
    ``slurmdbd`` stopped until at least one of the experiment's tasks has ended
    and a login node has reconciled since (sacct fails: the no-accounting path
    judges it), and at least the planned hold; then started again.
``node_lost``
    a node with training tasks on it lost with them: its ``slurmd`` and the tasks'
    processes SIGKILLed, then ``scontrol update State=DOWN`` (Slurm ends the tasks
    NODE_FAIL and requeues them); after the hold, slurmd started, ``State=RESUME``.

Whatever a fault stopped is restarted in a ``finally``. Each fault lands in the log
(:class:`~tests.integration.chaos.Record`), and each attempt a node loss ended in a
record of kind ``node_lost`` with its trial and attempt key.
"""

from __future__ import annotations

import random
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from dlhpc.protocol import read_event_batches
from tests.integration.chaos import Record, Task
from tests.integration.chaos_cluster import kill_node, restore_cluster, stop_daemon
from tests.integration.chaos_driver import ChaosDriver
from tests.integration.chaos_ticker import Pass

__all__ = [
    "FAULTS",
    "FAULT_CAUSES",
    "FAULT_CAUSES_NOACCT",
    "Fault",
    "InfraDriver",
    "make_fault_plan",
]

FAULTS = ("ctld_outage", "ctld_restart", "dbd_outage", "node_lost")
#: The causes dlhpc may record on an attempt a fault ended (status JSON).
FAULT_CAUSES: dict[str, set[str]] = {"node_lost": {"node_fail"}}
#: Without accounting: squeue shows the task requeued, not why.
FAULT_CAUSES_NOACCT: dict[str, set[str]] = {"node_lost": {"node_fail", "requeued"}}


@dataclass(frozen=True)
class Fault:
    """One planned fault: ``pick`` chooses the node, ``delay_s`` is waited once a
    task trains, ``hold_s`` is the least time the fault lasts."""

    kind: str
    pick: float
    delay_s: float
    hold_s: float


def make_fault_plan(seed: int, rounds: int = 1, accounting: bool = True) -> list[Fault]:
    """Every fault once per round (``dbd_outage`` only with ``accounting``), in a seeded
    order; a pure function of the arguments."""
    if rounds < 1:
        raise ValueError("need at least one round")
    rng = random.Random(seed)
    kinds = [k for k in FAULTS if accounting or k != "dbd_outage"]
    plan = []
    for _ in range(rounds):
        for kind in rng.sample(kinds, len(kinds)):
            hold = rng.uniform(3.0, 6.0) if kind != "ctld_restart" else 0.0
            plan.append(Fault(kind, rng.random(), rng.uniform(0.5, 2.0), round(hold, 1)))
    return plan


class InfraDriver(ChaosDriver):
    """Applies :func:`make_fault_plan`'s faults to a running experiment; a task is
    a target once its current run has stepped. :attr:`windows` says when each
    fault began and ended (restored included), by the real clock.

    The login nodes' loops reconcile meanwhile (nothing ticks here); ``passes_fn``
    returns the passes they logged so far; without ``accounting`` (no slurmdbd)
    the plan has no ``dbd_outage``. The other arguments are
    :class:`~tests.integration.chaos_driver.ChaosDriver`'s.
    """

    def __init__(
        self,
        seed: int,
        env: Mapping[str, str],
        job_ids_fn: Callable[[], Mapping[str, int]],
        *,
        run_dir: Path,
        passes_fn: Callable[[], list[Pass]],
        rounds: int = 1,
        accounting: bool = True,
        echo: bool = False,
    ) -> None:
        super().__init__(seed, env, job_ids_fn, run_dir=run_dir, echo=echo, min_steps_left=0)
        self.faults = make_fault_plan(seed, rounds, accounting)
        self.passes_fn = passes_fn
        self.windows: list[tuple[str, float, float]] = []  # (fault, wall start, wall end)

    def plan_text(self) -> str:
        return ", ".join(f.kind for f in self.faults)

    def _passes_since(self, t: float) -> list[Pass]:
        """Passes that started after ``t`` and reconciled (did not find the lease held)."""
        return [p for p in self.passes_fn() if p.start > t and not p.lease_held_elsewhere]

    def _until(self, what: str, done: Callable[[], bool], least_s: float) -> float:
        """Wait until ``done()`` and at least ``least_s``; the seconds waited."""
        t0 = time.monotonic()
        while not (done() and time.monotonic() - t0 >= least_s):
            if time.monotonic() - t0 > self.step_timeout_s:
                raise TimeoutError(f"chaos: gave up waiting for {what}\n{self.format_log()}")
            time.sleep(0.5)
        return time.monotonic() - t0

    def _training(self) -> list[Task]:
        tasks: list[Task] = self._wait("a training task", lambda ts: ts and self._trains(ts))
        return tasks

    def _trains(self, tasks: list[Task]) -> list[Task]:
        """The tasks whose current run stepped and has not exited (a run that ended
        while slurmctld was down shows RUNNING until its node reports it)."""
        return [t for t in tasks if self.training(t) and not self._exited(t)]

    def _exited(self, t: Task) -> bool:
        adir = self.run_dir / "trials" / f"trial-{t.trial_id:06d}" / "attempts"
        records = read_event_batches(adir / (t.attempt_key or ""))
        return any(r.get("type") == "exit" for b in records for r in b.records)

    def _restore(self, what: str, since: float) -> None:
        t0 = time.monotonic()
        did = restore_cluster(self.env)
        self.log(
            f"{what}-started",
            what,
            detail=f"after {t0 - since:.1f}s down; took {time.monotonic() - t0:.1f}s: {did}",
        )

    def _ctld(self, fault: Fault) -> None:
        tasks = self._training()
        time.sleep(fault.delay_s)
        stopped, wall = time.monotonic(), time.time()
        pid = stop_daemon(self.env, "slurmctld", signal.SIGTERM)
        on = [t.attempt_key for t in tasks]
        try:
            self.log(fault.kind, "slurmctld", detail=f"SIGTERM pid {pid}; training: {on}")
            if fault.kind == "ctld_outage":
                self._until(
                    "two passes without slurmctld",
                    lambda: len(self._passes_since(wall)) >= 2,
                    fault.hold_s,
                )
        finally:
            self._restore("slurmctld", stopped)

    def _dbd(self, fault: Fault) -> None:
        tasks = self._training()
        time.sleep(fault.delay_s)
        stopped = time.monotonic()
        pid = stop_daemon(self.env, "slurmdbd", signal.SIGTERM)
        before = {t.job_id for t in tasks}
        ended: dict[str, float] = {}  # task -> when it was seen gone
        try:
            self.log(fault.kind, "slurmdbd", detail=f"SIGTERM pid {pid}; running: {sorted(before)}")

            def one_ended_and_reconciled() -> bool:
                if not ended:
                    gone = before - {t.job_id for t in self.tasks()}
                    ended.update(dict.fromkeys(gone, time.time()))
                    return False
                return bool(self._passes_since(min(ended.values())))

            self._until(
                "a task ending while accounting is down", one_ended_and_reconciled, fault.hold_s
            )
            self.log("dbd-ended", ",".join(sorted(ended)), detail="ended while slurmdbd was down")
        finally:
            self._restore("slurmdbd", stopped)

    def _node(self, fault: Fault) -> None:
        tasks = self._training()
        nodes = sorted({t.node for t in tasks})
        node = nodes[int(fault.pick * len(nodes))]
        time.sleep(fault.delay_s)
        on = [t for t in self.tasks() if t.node == node]
        _, out = self._cmd("squeue", "-h", "-r", "-w", node, "-o", "%i|%A")
        ours = {t.job_id for t in on}
        raw = [r for i, _, r in (line.partition("|") for line in out.split()) if i in ours]
        stopped = time.monotonic()
        try:
            pids = kill_node(self.env, node, raw)
            down = ["scontrol", "update", f"NodeName={node}", "State=DOWN", "Reason=chaos"]
            rc, out = self._cmd(*down)
            self.log("node-down", node, detail=f"killed {pids}; {' '.join(down)} -> rc {rc} {out}")
            for t in on:  # a run that had ended keeps its cause
                kind = "node-lost-ended" if self._exited(t) else "node_lost"
                self.hit.add(t.attempt_key or "")
                self.log(kind, t.job_id, t.trial_id, attempt_key=t.attempt_key)
            time.sleep(fault.hold_s)
        finally:
            self._restore(node, stopped)  # starts slurmd, resumes the node

    def run(self) -> list[Record]:
        """Apply every fault of the plan, one after another."""
        self._t0 = time.monotonic()
        self.log("plan", f"seed {self.seed}", detail=self.plan_text())
        for fault in self.faults:
            start = time.time()
            try:
                if fault.kind.startswith("ctld"):
                    self._ctld(fault)
                elif fault.kind == "dbd_outage":
                    self._dbd(fault)
                else:
                    self._node(fault)
            finally:
                self.windows.append((fault.kind, start, time.time()))
        self.log("done", "-")
        return self.records
