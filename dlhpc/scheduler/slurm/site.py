"""What the Slurm cluster allows, read once: the config loader's cluster rules.

:class:`SlurmRules` implements :class:`dlhpc.config.ClusterRules` for ``dlhpc
launch`` (and ``--dry-run``) and ``dlhpc doctor``:

* partitions, the default one, and the GPU types and counts per partition come
  from one ``sinfo --all --noheader --format=%P|%G`` (``%P`` marks the default partition
  with ``*``; ``%G`` is the nodes' gres: ``gpu:2``, ``gpu:a100:2``,
  ``gpu:a100:2(S:0-1)`` where gres.conf binds cores (22.05 and later alike),
  several comma-separated, ``(null)`` for none). A failing sinfo raises
  SchedulerError: the launch stops (exit 1), nothing is submitted.
* the accounts and QOS of the user's associations come from one ``sacctmgr
  --noheader --parsable2 show associations user=<user> format=Account,QOS``
  (``lab|normal,high`` per line; one line per association, partition-specific
  ones included). Where it fails (no slurmdbd, accounting_storage/none) or lists
  nothing, the account and QOS are not checked, and :attr:`SlurmRules.warnings`
  says so (the CLI prints it: never a silent skip).

Each command runs only when a check needs it, at most once per instance.
:func:`doctor_checks` applies the same rules to the site file's own values.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from dlhpc._perms import current_user
from dlhpc.config import SiteConfig, association_problems
from dlhpc.errors import SchedulerError
from dlhpc.scheduler.plugins import Check
from dlhpc.scheduler.slurm.commands import one_line, run

__all__ = [
    "SINFO_GRES",
    "ClusterGres",
    "Runner",
    "SlurmRules",
    "associations_command",
    "doctor_checks",
    "parse_associations",
    "parse_sinfo_gres",
]

#: ``(argv) -> (exit code, stdout, stderr)``; raises SchedulerError when it cannot run.
Runner = Callable[[list[str]], tuple[int, str, str]]

SINFO_GRES = ["sinfo", "--all", "--noheader", "--format=%P|%G"]
_GRES_ITEMS = re.compile(r",(?![^()]*\))")  # commas outside "(S:0,1)"


def associations_command(user: str) -> list[str]:
    """The sacctmgr call listing ``user``'s associations as ``account|qos,qos``."""
    return [
        "sacctmgr",
        "--noheader",
        "--parsable2",
        "show",
        "associations",
        f"user={user}",
        "format=Account,QOS",
    ]


@dataclass(frozen=True)
class ClusterGres:
    """sinfo's answer: partition -> GPU types on its nodes; the default partition;
    partition -> the most GPUs one of its nodes has (all types together)."""

    gpu_types: dict[str, frozenset[str]] = field(default_factory=dict)
    default: str | None = None
    gpu_counts: dict[str, int] = field(default_factory=dict)


def parse_sinfo_gres(text: str) -> ClusterGres:
    """Parse ``sinfo --format=%P|%G`` lines (see the module doc). A line without ``|``
    is a partition name alone (no gres column)."""
    types: dict[str, set[str]] = {}
    counts: dict[str, int] = {}
    default = None
    for line in text.splitlines():
        name, _, gres = line.strip().partition("|")
        if not name:
            continue
        if name.endswith("*"):
            name = name[:-1]
            default = name
        found = types.setdefault(name, set())
        on_node = 0
        for item in _GRES_ITEMS.split(gres.strip()):
            parts = item.split("(", 1)[0].strip().split(":")
            if parts[0] != "gpu":
                continue
            if len(parts) >= 2 and not parts[1].isdigit():
                found.add(parts[1])
            on_node += int(parts[-1]) if len(parts) >= 2 and parts[-1].isdigit() else 1
        counts[name] = max(counts.get(name, 0), on_node)
    return ClusterGres({k: frozenset(v) for k, v in types.items()}, default, counts)


def parse_associations(text: str) -> dict[str, frozenset[str]]:
    """``account|qos1,qos2`` lines -> account -> QOS (lines of one account merged)."""
    out: dict[str, set[str]] = {}
    for line in text.splitlines():
        account, _, qos = line.strip().partition("|")
        if account:
            out.setdefault(account, set()).update(q for q in qos.split(",") if q.strip())
    return {k: frozenset(v) for k, v in out.items()}


def run_command(argv: list[str], timeout: float = 30.0) -> tuple[int, str, str]:
    """The default :data:`Runner`: :func:`~dlhpc.scheduler.slurm.commands.run`."""
    p = run(argv, timeout)
    return p.returncode, p.stdout, p.stderr


class SlurmRules:
    """The cluster's rules (see the module doc); ``user``: whose associations (default:
    the effective user, as Slurm sees the submitter)."""

    def __init__(self, run: Runner = run_command, user: str | None = None) -> None:
        self._run = run
        self._user = user
        self._gres: ClusterGres | None = None
        self._assoc: dict[str, frozenset[str]] | None = None
        self._assoc_read = False
        #: Checks skipped because the cluster could not answer, one line each.
        self.warnings: list[str] = []

    def _cluster(self) -> ClusterGres:
        if self._gres is None:
            code, out, err = self._run(SINFO_GRES)
            if code != 0:
                raise SchedulerError(f"sinfo failed (exit {code}): {one_line(err or out, 300)}")
            self._gres = parse_sinfo_gres(out)
        return self._gres

    def partitions(self) -> Collection[str]:
        return sorted(self._cluster().gpu_types)

    def default_partition(self) -> str | None:
        return self._cluster().default

    def gpu_types(self, partition: str) -> Collection[str] | None:
        return self._cluster().gpu_types.get(partition, frozenset())

    def associations(self) -> Mapping[str, Collection[str]] | None:
        if not self._assoc_read:
            self._assoc_read = True
            self._assoc = self._read_associations()
        return self._assoc

    def _read_associations(self) -> dict[str, frozenset[str]] | None:
        user = self._user or current_user()
        skip = "account and QOS not checked against Slurm"
        try:
            code, out, err = self._run(associations_command(user))
        except SchedulerError as exc:
            self.warnings.append(f"{skip}: {exc} (is accounting enabled?)")
            return None
        if code != 0:
            why = one_line(err or out, 300) or "no output"
            self.warnings.append(f"{skip}: sacctmgr failed (exit {code}): {why}")
            return None
        found = parse_associations(out)
        if not found:
            self.warnings.append(f"{skip}: sacctmgr lists no association for user {user!r}")
            return None
        return found


def doctor_checks(site: SiteConfig, rules: SlurmRules | None = None) -> list[Check]:
    """``dlhpc doctor``'s lines for the site's GPU types (each listed partition's
    ``gpu_type`` among its nodes' gres) and its default account and QOS (among the
    user's associations; a warning where accounting cannot tell)."""
    rules = rules if rules is not None else SlurmRules()
    checks: list[Check] = []
    typed = {p: i.gpu_type for p, i in sorted(site.partitions.items()) if i.gpu_type}
    if typed:
        try:
            bad = [
                f"{p}: {t!r} not among {', '.join(sorted(rules.gpu_types(p) or ())) or 'none'}"
                for p, t in typed.items()
                if p in rules.partitions() and t not in (rules.gpu_types(p) or ())
            ]
        except SchedulerError as exc:
            bad = [str(exc)]
        detail = "; ".join(bad) if bad else ", ".join(f"{p}: {t}" for p, t in typed.items())
        checks.append(Check("site GPU types", "fail" if bad else "ok", detail))
    if site.account is not None or site.qos is not None:
        assoc = rules.associations()
        if assoc is None:
            checks.append(Check("site account and QOS", "warn", "; ".join(rules.warnings)))
        else:
            problems = association_problems(site.account, site.qos, assoc)
            detail = "; ".join(problems.values()) or f"{site.account or '-'} / {site.qos or '-'}"
            checks.append(Check("site account and QOS", "fail" if problems else "ok", detail))
    return checks
