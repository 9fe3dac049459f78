"""What ``dlhpc site init`` learns from the live Slurm cluster, each command run once.

:func:`read_cluster` runs ``scontrol show config`` (version, select plugin, scrontab,
MaxArraySize, preemption, accounting: :mod:`~dlhpc.scheduler.slurm.features`),
``scontrol --oneliner show partition`` (time limits, the default partition, preemption
mode and tier), ``sinfo`` (GPU types and counts: :mod:`~dlhpc.scheduler.slurm.site`)
and, where ``AccountingStorageType`` is slurmdbd, ``sacctmgr`` (the user's
associations, the QOS table: :mod:`~dlhpc.scheduler.slurm.limits`; the user's default
account). Every value keeps the words of the command it came from, for the comments
of the site file (:mod:`~dlhpc.scheduler.slurm.sitefile`).

A failing ``scontrol`` or ``sinfo`` raises :class:`~dlhpc.errors.SchedulerError`: no
site can be described without them. A failing ``sacctmgr`` is not an error: the
description says why the accounts are unknown.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dlhpc._perms import current_user
from dlhpc.errors import SchedulerError, UsageError
from dlhpc.scheduler.plugins import Check
from dlhpc.scheduler.slurm.commands import one_line
from dlhpc.scheduler.slurm.features import feature_checks, parse_config
from dlhpc.scheduler.slurm.limits import Limits, read_limits
from dlhpc.scheduler.slurm.site import SINFO_GRES, Runner, parse_sinfo_gres, run_command

__all__ = [
    "SCONTROL_CONFIG",
    "SCONTROL_PARTITIONS",
    "Accounting",
    "ClusterFacts",
    "Partition",
    "default_account_command",
    "parse_partitions",
    "read_cluster",
]

SCONTROL_CONFIG = ["scontrol", "show", "config"]
SCONTROL_PARTITIONS = ["scontrol", "--oneliner", "show", "partition"]


def default_account_command(user: str) -> list[str]:
    """The sacctmgr call printing ``user``'s default account alone."""
    return ["sacctmgr", "-n", "-P", "show", "user", user, "format=DefaultAccount"]


@dataclass(frozen=True)
class Partition:
    """One partition: ``settings`` are ``scontrol show partition``'s ``Key=Value``
    words; the GPUs of its nodes from ``sinfo %G``; ``higher``: the partitions of a
    higher ``PriorityTier`` (whose jobs may preempt this one's under
    ``preempt/partition_prio``)."""

    name: str
    settings: dict[str, str]
    gpus_per_node: int
    gpu_types: tuple[str, ...]
    higher: tuple[str, ...] = ()

    @property
    def max_time(self) -> str:
        """``MaxTime`` as Slurm prints it; ``UNLIMITED`` where unset."""
        return self.settings.get("MaxTime") or "UNLIMITED"

    @property
    def tier(self) -> int:
        """``PriorityTier`` (Slurm's default 1)."""
        return _tier(self.settings)


def _tier(settings: dict[str, str]) -> int:
    raw = settings.get("PriorityTier", "")
    return int(raw) if raw.isdigit() else 1


@dataclass(frozen=True)
class Accounting:
    """The user's associations and limits (``sacctmgr``), or why they are unknown
    (``limits`` None, ``problem`` the reason)."""

    storage: str
    enforce: str
    limits: Limits | None = None
    default_account: str | None = None
    problem: str | None = None


@dataclass(frozen=True)
class ClusterFacts:
    """Everything :func:`read_cluster` read, as the site file needs it."""

    user: str
    config: dict[str, str]
    partitions: tuple[Partition, ...]
    default_partition: str | None
    cons_tres: Check
    scrontab: Check
    accounting: Accounting

    @property
    def max_array_size(self) -> str:
        return self.config.get("MaxArraySize", "")

    @property
    def preempt_type(self) -> str:
        return self.config.get("PreemptType", "") or "preempt/none"


def parse_partitions(text: str) -> dict[str, dict[str, str]]:
    """``scontrol --oneliner show partition``: one line per partition of ``Key=Value``
    words -> partition name -> its words (a word without ``=`` is skipped)."""
    out: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        words = dict(w.split("=", 1) for w in line.split() if "=" in w)
        name = words.get("PartitionName", "")
        if name:
            out[name] = words
    return out


def _checked(run: Runner, argv: list[str]) -> str:
    code, out, err = run(argv)
    if code != 0:
        what = " ".join(argv[:3])
        raise SchedulerError(f"{what} failed (exit {code}): {one_line(err or out, 300)}")
    return out


def _partitions(
    settings: dict[str, dict[str, str]], sinfo: str, only: Sequence[str]
) -> tuple[tuple[Partition, ...], str | None]:
    gres = parse_sinfo_gres(sinfo)
    unknown = [p for p in only if p not in settings]
    if unknown:
        raise UsageError(
            f"--partition {', '.join(unknown)}: not on this cluster"
            f" (scontrol show partition lists {', '.join(settings) or 'none'})"
        )
    names = list(dict.fromkeys(only)) if only else list(settings)
    parts = tuple(
        Partition(
            name,
            settings[name],
            gres.gpu_counts.get(name, 0),
            tuple(sorted(gres.gpu_types.get(name, ()))),
            tuple(n for n, s in settings.items() if _tier(s) > _tier(settings[name])),
        )
        for name in names
    )
    default = next((n for n, s in settings.items() if s.get("Default") == "YES"), gres.default)
    return parts, default


def _accounting(run: Runner, config: dict[str, str], user: str) -> Accounting:
    storage = config.get("AccountingStorageType", "") or "(null)"
    enforce = config.get("AccountingStorageEnforce", "") or "none"
    if "slurmdbd" not in storage:
        return Accounting(storage, enforce, problem=f"AccountingStorageType={storage}")

    def stdout(argv: list[str]) -> str:
        return _checked(run, argv)

    try:
        limits = read_limits(stdout, user)
        default = stdout(default_account_command(user)).strip().splitlines()
    except (SchedulerError, ValueError) as err:  # ValueError: a user name unsafe to pass
        return Accounting(storage, enforce, problem=str(err))
    if not limits.associations:
        return Accounting(storage, enforce, problem=f"sacctmgr lists no association for {user}")
    account = default[0].strip().lower() if default and default[0].strip() else None
    return Accounting(storage, enforce, limits, account)


def read_cluster(
    run: Runner = run_command, user: str | None = None, only: Sequence[str] = ()
) -> ClusterFacts:
    """The cluster as ``user`` (default: the effective user) sees it; ``only``: these
    partitions (a name the cluster lacks is a :class:`~dlhpc.errors.UsageError`),
    else every partition ``scontrol show partition`` lists."""
    user = user or current_user()
    config_text = _checked(run, SCONTROL_CONFIG)
    config = parse_config(config_text)
    checks = {c.name: c for c in feature_checks(lambda argv: (0, config_text))}
    settings = parse_partitions(_checked(run, SCONTROL_PARTITIONS))
    partitions, default = _partitions(settings, _checked(run, SINFO_GRES), only)
    return ClusterFacts(
        user=user,
        config=config,
        partitions=partitions,
        default_partition=default,
        cons_tres=checks["gpus per node (cons_tres)"],
        scrontab=checks["scrontab"],
        accounting=_accounting(run, config, user),
    )
