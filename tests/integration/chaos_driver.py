"""The seeded chaos driver: applies a plan (:func:`tests.integration.chaos.make_plan`)
to the running tasks of one experiment, in between ``dlhpc tick`` calls (the actions:
:mod:`tests.integration.chaos`)."""

from __future__ import annotations

import contextlib
import math
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from dlhpc.protocol import PROGRESS_FILE, read_small_json
from tests.integration._reference import (
    hog_argv,
)
from tests.integration.chaos import Record, Step, Task, make_plan
from tests.integration.chaos_cluster import kill_slurmd, restore_cluster

__all__ = ["ChaosDriver"]


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
                detail=f"after {step.hold_s}s down, took {time.monotonic() - t0:.1f}s: {tail}",
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
