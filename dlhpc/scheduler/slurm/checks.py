"""The Slurm backend's checks: ``dlhpc doctor``'s Slurm lines, the state-folder rule
for sbatch log paths, and the version line of the reproducibility record."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from dlhpc.config.schema import SiteConfig
from dlhpc.scheduler.plugins import Check
from dlhpc.scheduler.slurm import sbatch_on_path
from dlhpc.scheduler.slurm import site as site_rules
from dlhpc.scheduler.slurm._pyslurm import poll_path
from dlhpc.scheduler.slurm.features import feature_checks
from dlhpc.scheduler.slurm.limits import NO_ACCOUNTING, limits_check

__all__ = ["doctor_checks", "pyslurm_check", "state_dir_problem", "version_record"]


def _run(cmd: list[str], timeout: float = 20) -> tuple[int, str]:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return 127, str(err)
    return p.returncode, (p.stdout + p.stderr).strip()


def state_dir_problem(state_dir: Path) -> str | None:
    """sbatch reads ``%`` in ``--output``/``--error`` as a file-name pattern (``%j``,
    ``%u``, ...), so job logs under such a folder land elsewhere than recorded."""
    if "%" not in str(state_dir):
        return None
    return (
        f"the state folder {state_dir} contains '%', which Slurm reads as a pattern in log file"
        " names; set DLHPC_HOME (or the site's state_dir) to a folder without '%'"
    )


def pyslurm_check() -> Check:
    """How ``poll`` reads the queue in this process (pyslurm or squeue), and why."""
    return Check("queue polling", "ok", poll_path().reason)


def _cluster_checks(site: SiteConfig) -> list[Check]:
    code, out = _run(["sinfo", "-h", "-o", "%P"])
    if code != 0:
        return [Check("slurm reachable", "fail", out.splitlines()[-1] if out else f"exit {code}")]
    parts = {p.rstrip("*") for p in out.split()}
    checks = [Check("slurm reachable", "ok", f"partitions: {', '.join(sorted(parts))}")]
    checks += feature_checks(_run)  # version, cons_tres, scrontab, requeue
    code, out = _run(["sacct", "-n", "-X", "-P", "-S", "now-1hours", "--format=JobID"])
    if code == 0:
        checks.append(Check("accounting (sacct)", "ok", "sacct answers"))
    else:
        why = out.splitlines()[-1] if out else f"exit {code}"
        fix = " fix: ask the admins for AccountingStorageType=accounting_storage/slurmdbd"
        checks.append(Check("accounting (sacct)", "warn", NO_ACCOUNTING.format(why=why) + fix))
    checks.append(limits_check(site, _run))
    wanted = set(site.partitions) | ({site.partition} if site.partition else set())
    missing = sorted(wanted - parts)
    checks.append(
        Check(
            "site partitions",
            "fail" if missing else "ok",
            f"missing on this cluster: {', '.join(missing)}" if missing else "all present",
        )
    )
    return checks


def doctor_checks(site: SiteConfig) -> list[Check]:
    """Slurm's lines for a site whose backend is ``slurm`` or ``auto``: reachable, the
    version and the features dlhpc relies on (:mod:`~dlhpc.scheduler.slurm.features`),
    accounting, the site's partitions, and how the queue is polled."""
    if site.backend not in ("slurm", "auto"):
        return [Check("slurm", "skip", f"site {site.name} uses the {site.backend} backend")]
    if not sbatch_on_path(os.environ):
        status = "fail" if site.backend == "slurm" else "skip"
        checks = [Check("slurm", status, "sbatch not on PATH (the local backend runs trials here)")]
    else:
        checks = [*_cluster_checks(site), *site_rules.doctor_checks(site)]
    return [*checks, pyslurm_check()]


def version_record() -> dict[str, Any] | None:
    """``{"version": "slurm 23.11.4"}`` from ``sinfo`` (else ``scontrol``), ``{"error"}``
    when it fails, None where neither is installed."""
    for tool in ("sinfo", "scontrol"):
        if shutil.which(tool) is not None:
            code, out = _run([tool, "--version"], timeout=10)
            return {"version": out} if code == 0 else {"error": f"{tool} --version: {out}"}
    return None
