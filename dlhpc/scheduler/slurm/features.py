"""``dlhpc doctor``'s lines on the Slurm features dlhpc relies on, from one
``scontrol show config``: the version, ``select/cons_tres`` (``--gpus-per-node``),
scrontab (``ScronParameters=enable``) and job requeue (``JobRequeue``, and
``JobSubmitPlugins``, which may override it). Each line that is not ok says the fix in
one line. Accounting (``sacct``) is checked by
:mod:`dlhpc.scheduler.slurm.checks`, which runs it.

The text parsed is the same on Slurm 22.05, 24.11 and 26.05: ``Name = value`` lines
(``(null)`` for an unset value) and ``SLURM_VERSION = 22.05.8``.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from dlhpc.scheduler.plugins import Check

__all__ = ["feature_checks", "parse_config"]

_LINE = re.compile(r"^(?P<key>[A-Za-z_][A-Za-z0-9_]*)\s*=\s?(?P<value>.*)$")

Runner = Callable[[list[str]], tuple[int, str]]


def parse_config(text: str) -> dict[str, str]:
    """``scontrol show config``'s ``Name = value`` lines; ``(null)`` becomes ""."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if m is not None and m["key"] not in out:
            value = m["value"].strip()
            out[m["key"]] = "" if value == "(null)" else value
    return out


def _words(value: str) -> set[str]:
    return {w.strip().lower() for w in value.split(",") if w.strip()}


def _version(config: dict[str, str]) -> Check:
    version = config.get("SLURM_VERSION", "")
    if not version:
        return Check("slurm version", "warn", "scontrol show config gave no SLURM_VERSION")
    return Check("slurm version", "ok", version)


def _cons_tres(config: dict[str, str]) -> Check:
    select = config.get("SelectType", "")
    if select == "select/cons_tres":
        return Check("gpus per node (cons_tres)", "ok", "SelectType=select/cons_tres")
    return Check(
        "gpus per node (cons_tres)",
        "warn",
        f"SelectType={select or 'unset'}: --gpus-per-node needs select/cons_tres; "
        "fix: request GPUs with --gres (site partitions' gpu request) or ask the admins",
    )


def _scrontab(config: dict[str, str]) -> Check:
    if "ScronParameters" not in config:
        return Check(
            "scrontab", "warn", "this Slurm has no scrontab; fix: `dlhpc cron` into crontab"
        )
    if "enable" in _words(config["ScronParameters"]):
        return Check("scrontab", "ok", "enabled: `dlhpc cron --scrontab` prints the entry")
    return Check(
        "scrontab",
        "warn",
        "disabled (ScronParameters lacks enable); fix: `dlhpc cron` into crontab on the "
        "login node, or ask the admins for ScronParameters=enable",
    )


def _requeue(config: dict[str, str]) -> Check:
    """JobRequeue, and the job_submit plugins that may override the job's --requeue (a
    site's lua can make every job not requeueable: Slurm then refuses its owner's
    ``scontrol requeue``, "Requested operation is presently disabled")."""
    value = config.get("JobRequeue", "")
    plugins = config.get("JobSubmitPlugins", "")
    may_deny = (
        f" JobSubmitPlugins={plugins}: a site plugin may make jobs not requeueable; then "
        "Slurm refuses the job's `scontrol requeue` after the time-limit signal, the "
        "attempt's log says so, and the reconciler submits the trial again (no action "
        "needed; a preempted job is resubmitted the same way)."
        if plugins
        else ""
    )
    if value == "0":
        detail = (
            "JobRequeue=0 (jobs are not requeued by default); dlhpc asks --requeue per job. "
            "fix if preempted jobs still vanish: ask the admins to allow requeue" + may_deny
        )
        return Check("job requeue", "warn", detail)
    return Check(
        "job requeue",
        "ok",
        f"JobRequeue={value or 'default (1)'}; where `scontrol requeue` is refused, the "
        "reconciler submits the trial again." + may_deny,
    )


def feature_checks(run: Runner) -> list[Check]:
    """The version and feature lines from one ``scontrol show config`` (through ``run``,
    which returns (exit code, output)); one warn line when scontrol fails."""
    code, out = run(["scontrol", "show", "config"])
    if code != 0:
        last = out.splitlines()[-1] if out else f"exit {code}"
        return [Check("slurm features", "warn", f"scontrol show config failed: {last}")]
    config = parse_config(out)
    return [_version(config), _cons_tres(config), _scrontab(config), _requeue(config)]
