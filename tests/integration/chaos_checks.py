"""What a chaos campaign must leave behind (:func:`check_campaign`, on the result of
:func:`tests.integration.chaos_campaign.run_campaign`)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlhpc.protocol import HEARTBEAT_FILE, PROGRESS_FILE, read_event_batches, read_small_json
from tests.integration._reference import (
    PLANNED_EXIT_NOISE,
    final_sha,
    logs_of,
)
from tests.integration.chaos import (
    ACTIONS,
    EXPECTED_CAUSES,
    METRIC_NAMES,
    Record,
)
from tests.integration.conftest import Cli

if TYPE_CHECKING:
    from tests.integration.chaos_campaign import CampaignConfig, CampaignResult

__all__ = [
    "Need",
    "Outcome",
    "check_campaign",
    "check_hit",
    "check_logs",
    "check_outcome",
    "check_weights",
    "needer",
    "read_only_db",
]


def read_only_db(db: Path) -> sqlite3.Connection:
    """The state database opened read-only (a tick's write lock is waited out)."""
    return sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)


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


Need = Callable[[object, str], None]


@dataclass(frozen=True)
class Outcome:
    """What :func:`check_outcome` counted: the steps each trial trained (by trial id),
    the experiment's attempts, and its metric rows expected and found."""

    steps: dict[int, int]
    attempts: int
    rows_expected: int
    rows_found: int

    def figures(self, faults: Mapping[str, int]) -> dict[str, Any]:
        """The campaign's figures, ``faults`` the times each kind of fault hit."""
        return {
            "faults_survived": dict(faults),
            "trials": len(self.steps),
            "attempts": self.attempts,
            "metric_rows": self.rows_found,
            "metric_rows_expected": self.rows_expected,
            "rows_lost": self.rows_expected - self.rows_found,
        }


def needer(log: str, exp: Mapping[str, Any]) -> Need:
    """``need(ok, what)``: an AssertionError carrying the chaos log and the status."""

    def need(ok: object, what: str) -> None:
        if not ok:
            raise AssertionError(
                f"{what}\n--- chaos log ---\n{log}\n--- status ---\n{json.dumps(exp, indent=1)}"
            )

    return need


def check_outcome(
    cli: Cli, exp: Mapping[str, Any], max_length: int, need: Need, *, early_stops: bool = False
) -> Outcome:
    """What any campaign must leave; what it counted (:class:`Outcome`).

    * the experiment COMPLETED; every trial COMPLETED with ``max_length`` steps (with
      ``early_stops``, a trial may also end STOPPED_EARLY with fewer), ``crashes == 0``
      (chaos is never the trial's fault) and a restart counted for each attempt but
      the last that did not pause (an ASHA rung's end is no restart);
    * no two attempts of a trial ran at the same time (from the workers' start and
      exit records, heartbeats and progress files), and any epoch an attempt
      reported twice has identical values;
    * metrics exactly once: ``3 x steps`` rows per trial, steps 1..steps, no gap;
    * ``PRAGMA integrity_check`` is ok.
    """
    need(exp["state"] == "COMPLETED", f"experiment {exp['state']}")
    trials = {int(t["id"]): t for t in exp["trials"]}
    steps: dict[int, int] = {}
    for t in trials.values():
        done = t["steps_completed"]
        full = t["state"] == "COMPLETED" and done == max_length
        early = early_stops and t["state"] == "STOPPED_EARLY" and 0 < done < max_length
        need(full or early, f"trial {t['id']} {t['state']} at step {done}")
        need(t["crashes"] == 0, f"trial {t['id']} counted {t['crashes']} crash(es)")
        restarts = sum(a["cause"] != "paused" for a in t["attempts"][:-1])
        need(t["restarts"] == restarts, f"trial {t['id']} restarts {t['restarts']} != {restarts}")
        steps[int(t["id"])] = done
    _check_spans(Path(exp["run_dir"]), trials, need)
    con = read_only_db(cli.home / "dlhpc.db")
    try:
        rows = con.execute(
            "SELECT m.trial_id, m.step, m.name FROM metrics m JOIN trials t ON m.trial_id = t.id"
            " WHERE t.experiment_id = ?",
            (exp["id"],),
        ).fetchall()
        integrity = con.execute("PRAGMA integrity_check").fetchone()
    finally:
        con.close()
    expected = 3 * sum(steps.values())
    need(len(rows) == len(set(rows)) == expected, f"{len(rows)} metric rows, expected {expected}")
    for trial_id, done in steps.items():
        got = {s for tid, s, _n in rows if tid == trial_id}
        names = {n for tid, _s, n in rows if tid == trial_id}
        need(got == set(range(1, done + 1)), f"trial {trial_id}: metric steps {got}")
        need(names == METRIC_NAMES, f"trial {trial_id}: metric names {names}")
    need(integrity == ("ok",), f"integrity_check: {integrity}")
    attempts = sum(len(t["attempts"]) for t in trials.values())
    return Outcome(steps, attempts, expected, len(rows))


def _check_spans(run_dir: Path, trials: Mapping[int, Any], need: Need) -> None:
    """One run of a trial at a time; re-reported epochs agree."""
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


def check_hit(
    trials: Mapping[int, Mapping[str, Any]], r: Record, causes: set[str], need: Need
) -> int:
    """The attempt ``r`` hit is known to dlhpc, ended with one of ``causes`` and was
    followed by another attempt of its trial; its index among the trial's attempts."""
    assert r.trial_id is not None
    keys = [a["key"] for a in trials[r.trial_id]["attempts"]]
    need(r.attempt_key in keys, f"{r.kind}: attempt {r.attempt_key} unknown to dlhpc")
    i = keys.index(r.attempt_key)
    cause = trials[r.trial_id]["attempts"][i]["cause"]
    need(cause in causes, f"{r.kind} of {r.attempt_key}: cause {cause!r}, expected {causes}")
    need(i < len(keys) - 1, f"{r.kind} of {r.attempt_key}: no later attempt")
    return i


def check_weights(cli: Cli, exp_id: int, refs: Mapping[int, str], need: Need) -> None:
    """Each trial's final weights bitwise equal its uninterrupted reference's."""
    for tid, ref in refs.items():
        got = final_sha(cli, exp_id, tid)
        need(got == ref, f"trial {tid}: final weights {got} != reference {ref}")


def check_campaign(cli: Cli, result: CampaignResult, cfg: CampaignConfig) -> None:
    """Assert what must hold after a chaos run (AssertionErrors carry the chaos log).

    * every action type hit at least once per round, the hog preempted at least
      one running trial, and the walltime signal came before the trial's end;
    * :func:`check_outcome`, every trial trained to ``max_length``;
    * each attempt an action hit ended with a cause in :data:`EXPECTED_CAUSES`
      and a later attempt of that trial exists (restarts are recorded); the
      walltime target's attempt exited on USR2 and sacct shows its task TIMEOUT
      or REQUEUED;
    * the logs (:func:`check_logs`);
    * the final weights equal those of an uninterrupted plain-process run.
    """
    exp = result.exp
    need = needer(result.driver.format_log(), exp)
    records = result.driver.records
    counts: dict[str, int] = defaultdict(int)
    for r in records:
        counts[r.kind] += 1
    for kind in ACTIONS:
        need(counts[kind] >= cfg.rounds, f"action {kind} hit {counts[kind]} time(s)")
    need(counts["hog"] >= cfg.rounds, "no hog was submitted")
    need(counts["walltime-fired"] >= cfg.rounds, "the walltime signal never hit")
    trials = {t["id"]: t for t in exp["trials"]}
    need(len(trials) == cfg.trials, f"{len(trials)} trials, expected {cfg.trials}")
    outcome = check_outcome(cli, exp, cfg.epochs, need)
    result.figures.update(outcome.figures({kind: counts[kind] for kind in ACTIONS}))

    con = read_only_db(cli.home / "dlhpc.db")
    try:
        exit_reason = dict(
            con.execute(
                "SELECT trial_id || ':' || attempt_key, exit_reason FROM attempts"
            ).fetchall()
        )
    finally:
        con.close()
    for r in records:
        if r.kind not in EXPECTED_CAUSES or r.trial_id is None:
            continue
        check_hit(trials, r, EXPECTED_CAUSES[r.kind], need)
        if r.kind == "walltime":
            reason = exit_reason.get(f"{r.trial_id}:{r.attempt_key}") or ""
            need("USR2" in reason, f"walltime of {r.attempt_key}: exit reason {reason!r}")
            states = _sacct_states(cli.env, r.target)
            need(
                {"TIMEOUT", "REQUEUED"} & set(states),
                f"walltime of {r.target}: sacct shows {states}",
            )
            result.notes.append(f"walltime {r.target}: sacct {states}, exit {reason}")

    check_logs(cli, result.driver.records, trials, result.exp_id, need)
    check_weights(cli, result.exp_id, result.references.wait(), need)


def check_logs(
    cli: Cli,
    records: Iterable[Record],
    trials: Mapping[int, Mapping[str, Any]],
    exp_id: int,
    need: Need,
    causes: Mapping[str, set[str]] = EXPECTED_CAUSES,
) -> None:
    """``dlhpc logs`` after each action: an attempt after the one it hit prints the
    script's resume (Slurm's requeue under the same id: the same log as the hit run; a
    resubmission: the new job's); the hit attempt's stderr shows no traceback and no srun
    error when every run of its job ended as planned (exit 75 or 0; a task that requeued
    itself at its time limit included); and each trial's latest log ends with its final
    weights. Every problem is listed, not just the first."""
    problems = []
    for r in records:
        if r.kind not in causes or r.trial_id is None or r.attempt_key is None:
            continue
        attempts = trials[r.trial_id]["attempts"]
        i = [a["key"] for a in attempts].index(r.attempt_key)
        # the next attempt that trained resumed (one hit again before its script started,
        # as a preemption of a freshly requeued run, resumes in the attempt after it)
        later = [_logs_or_error(cli, r.trial_id, a["key"])[0] for a in attempts[i + 1 :]]
        if not any("resumed at epoch" in out for out in later):
            shown = "\n".join(later) or "(no later attempt)"
            problems.append(f"{r.kind}: no attempt after {r.attempt_key} resumed:\n{shown}")
        job = attempts[i]["job_id"]
        if all(a["exit_code"] in (0, 75) for a in attempts if a["job_id"] == job):
            _, err = _logs_or_error(cli, r.trial_id, r.attempt_key)
            if noise := [x for x in PLANNED_EXIT_NOISE if x in err]:
                problems.append(f"{r.kind}: the log of {r.attempt_key} shows {noise}:\n{err}")
    for tid in trials:
        out, _ = _logs_or_error(cli, tid)
        sha = final_sha(cli, exp_id, tid)
        if f"weights_sha256={sha}" not in out:
            problems.append(f"trial {tid}: dlhpc logs lacks its final weights:\n{out}")
    need(not problems, "\n".join(problems))


def _logs_or_error(cli: Cli, trial_id: int, key: str | None = None) -> tuple[str, str]:
    """:func:`logs_of`, or its failure's message as both streams (then checked as text)."""
    try:
        return logs_of(cli, trial_id, key)
    except AssertionError as err:
        return str(err), str(err)
