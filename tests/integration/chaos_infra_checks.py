"""What the infrastructure campaign must leave behind (:func:`check_infra_campaign`, on
the result of :func:`tests.integration.chaos_infra_campaign.run_infra_campaign`)."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlhpc.protocol import read_event_batches
from tests.integration._reference import seed_of, start_references
from tests.integration.chaos_checks import (
    Need,
    check_hit,
    check_logs,
    check_outcome,
    check_weights,
    needer,
)
from tests.integration.chaos_infra import FAULT_CAUSES, FAULT_CAUSES_NOACCT, FAULTS
from tests.integration.conftest import Cli

if TYPE_CHECKING:
    from tests.integration.chaos_infra_campaign import InfraConfig, InfraResult

__all__ = ["AFTERMATH_S", "PLAIN_CAUSES", "check_infra_campaign"]

#: The causes of the attempts no fault hit: a rung's end, or the trial's.
PLAIN_CAUSES = {"paused", "completed"}
#: How long after a fault's end a pass may still warn about it.
AFTERMATH_S = 15.0


def check_infra_campaign(cli: Cli, result: InfraResult, cfg: InfraConfig) -> None:
    """Assert what must hold after the campaign (AssertionErrors carry its log):

    * every fault hit at least once per round (``dbd_outage`` only with
      accounting), a node loss ended a training attempt, a task ended while
      accounting was down, and ASHA promoted a trial;
    * :func:`~tests.integration.chaos_checks.check_outcome` (COMPLETED, or
      STOPPED_EARLY at a rung; no crash; no overlap; metrics exactly once;
      integrity);
    * each attempt a node loss ended has cause ``node_fail`` (without accounting,
      ``requeued`` too: squeue does not say why) and a later attempt;
      every other attempt ended ``paused`` or ``completed`` (the outages, the
      skewed clock and the second login node misjudged nothing), and every
      attempt's run started (nothing was submitted twice);
    * the login nodes' passes (:func:`_check_passes`);
    * each trial's log ends with its final weights, which equal those of an
      uninterrupted run to its steps; ``dlhpc report`` builds.
    """
    exp = result.exp
    passes = "\n".join(json.dumps(p.__dict__) for p in result.passes)
    need = needer(f"{result.driver.format_log()}\n--- passes ---\n{passes}", exp)
    trials = {int(t["id"]): t for t in exp["trials"]}
    by_steps: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for t in trials.values():  # the references train while the rest is checked
        by_steps[t["steps_completed"]].append(t)
    refs = [
        start_references(result.workdir, ts, steps, {t["id"]: seed_of(cli, t["id"]) for t in ts})
        for steps, ts in by_steps.items()
        if steps > 0
    ]
    counts: dict[str, int] = defaultdict(int)
    for r in result.driver.records:
        counts[r.kind] += 1
    kinds = [k for k in FAULTS if cfg.accounting or k != "dbd_outage"]  # node_lost: per attempt
    kinds += ["node-down", "dbd-ended"] if cfg.accounting else ["node-down"]
    for kind in kinds:
        need(counts[kind] >= cfg.rounds, f"{kind} logged {counts[kind]} time(s)")
    outcome = check_outcome(cli, exp, cfg.max_length, need, early_stops=True)
    promoted = [t["id"] for t in trials.values() if any_promotion(t["attempts"])]
    need(promoted, "no trial was promoted")
    faults = {k: counts[k] for k in FAULTS if cfg.accounting or k != "dbd_outage"}
    result.figures.update(outcome.figures(faults), promoted=len(promoted))

    hit = set()
    causes = FAULT_CAUSES if cfg.accounting else FAULT_CAUSES_NOACCT
    for r in result.driver.records:
        if r.kind in causes and r.trial_id is not None:
            check_hit(trials, r, causes[r.kind], need)
            hit.add((r.trial_id, r.attempt_key))
    run_dir = Path(exp["run_dir"])
    for tid, t in trials.items():
        for a in t["attempts"]:
            if (tid, a["key"]) not in hit:
                need(a["cause"] in PLAIN_CAUSES, f"trial {tid} attempt {a['key']}: {a['cause']}")
            adir = run_dir / "trials" / f"trial-{tid:06d}" / "attempts" / a["key"]
            starts = [
                r for b in read_event_batches(adir) for r in b.records if r["type"] == "start"
            ]
            need(starts, f"trial {tid} attempt {a['key']} never ran")
    _check_passes(result, cfg, need)
    check_logs(cli, [], trials, result.exp_id, need)
    report = result.workdir / "report.html"
    cli("report", str(result.exp_id), "-o", str(report))
    need(report.stat().st_size > 0, "the report is empty")
    check_weights(cli, result.exp_id, {k: v for r in refs for k, v in r.wait().items()}, need)
    fig = result.figures
    result.notes.append(
        f"{fig['trials']} trials ({fig['promoted']} promoted), {fig['attempts']} attempts, "
        f"{fig['metric_rows']} metric rows ({fig['rows_lost']} lost), {len(result.passes)} passes"
    )


def any_promotion(attempts: list[Mapping[str, Any]]) -> bool:
    """An attempt paused at a rung's end and a later one trained on."""
    return any(a["cause"] == "paused" for a in attempts[:-1])


def _check_passes(result: InfraResult, cfg: InfraConfig, need: Need) -> None:
    """Both login nodes reconciled and once found the lease held by the other; no pass
    raised or stalled; a pass warned only during a fault (or :data:`AFTERMATH_S`
    after); at least two passes warned while slurmctld was out."""
    passes = result.passes
    for login in ("login1", "login2"):
        mine = [p for p in passes if p.login == login and not p.lease_held_elsewhere]
        need(len(mine) >= 3, f"{login} reconciled {len(mine)} time(s)")
    need(any(p.lease_held_elsewhere for p in passes), "the login nodes never met at the lease")
    windows = result.driver.windows
    for p in passes:
        need(p.raised is None and p.stalled is None, f"{p.login}: a pass failed: {p}")
        if p.errors:
            during = [k for k, s, e in windows if p.start <= e + AFTERMATH_S and p.end >= s]
            need(during, f"{p.login}: a pass warned outside any fault: {p.errors}")
    for kind, start, end in windows:
        if kind == "ctld_outage":
            warned = [p for p in passes if start <= p.start <= end and p.errors]
            need(len(warned) >= 2, f"{len(warned)} pass(es) warned while slurmctld was out")
    counted = {
        "total": len(passes),
        "login1": sum(p.login == "login1" for p in passes),
        "login2": sum(p.login == "login2" for p in passes),
        "lease_held": sum(p.lease_held_elsewhere for p in passes),
        "warned": sum(bool(p.errors) for p in passes),
        "login1_clock_off_s": cfg.signed_skew_s,
        "login2_delay_per_file_op_s": cfg.io_delay_s,
    }
    result.figures["passes"] = counted
    result.notes.append(
        f"passes: {counted['login1']} on login1 (clock {cfg.signed_skew_s:+.0f}s), "
        f"{counted['login2']} on login2 ({cfg.io_delay_s}s per file operation), "
        f"{counted['lease_held']} found the lease held, {counted['warned']} warned"
    )
