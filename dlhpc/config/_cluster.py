"""An experiment's account, QOS, partition and GPU type checked against the cluster.

The site file can only describe the cluster; the cluster itself knows which
partitions and GPU types it has and which accounts and QOS the user may use.
The loader gets those facts through :class:`ClusterRules` (the backend
implements it, e.g. ``dlhpc.scheduler.slurm.site``; config runs no command):
each fact is asked for at most once and only when a value needs it. A value the
cluster does not know is a config error at the line that set it (the
experiment's ``resources.*`` key, else the site file's key) that lists the
valid values. Facts the cluster cannot give (``None``: accounting off) skip
their check; saying so is the implementer's part (a warning line).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any, Protocol

from dlhpc.config._partitions import check_cluster_partition, site_issue
from dlhpc.config._validate import Issues, did_you_mean
from dlhpc.config.schema import Resources, SiteConfig
from dlhpc.errors import ConfigIssue

__all__ = ["ClusterRules", "RulesFactory", "association_problems", "check_cluster"]


class ClusterRules(Protocol):
    """What a cluster allows; each method may run a command (once) and raise
    :class:`~dlhpc.errors.SchedulerError` when the cluster does not answer."""

    def partitions(self) -> Collection[str]:
        """Every partition name, hidden ones included."""
        ...

    def default_partition(self) -> str | None:
        """The partition a job without one goes to, when known."""
        ...

    def gpu_types(self, partition: str) -> Collection[str] | None:
        """The GPU types the partition's nodes have (empty: untyped, or no GPUs;
        None: not known, the type is not checked)."""
        ...

    def associations(self) -> Mapping[str, Collection[str]] | None:
        """The user's accounts -> the QOS each allows (empty: not known); None when
        the cluster cannot tell (then the account and QOS are not checked)."""
        ...


#: The rules for a backend name (None: that backend has none), asked once a site
#: has resolved its backend.
RulesFactory = Callable[[str], ClusterRules | None]


def check_cluster(
    issues: Issues,
    site: SiteConfig,
    res: Resources,
    given: Mapping[str, Any],
    rules: ClusterRules,
) -> list[ConfigIssue]:
    """Check ``res`` against ``rules``; ``given``: the experiment's ``resources``
    mapping (a key there makes a problem the experiment's, added to ``issues``;
    else it is the site file's and returned)."""
    out: list[ConfigIssue] = []
    partition_ok = issues.ok(("resources", "partition"))
    if partition_ok:
        ours = bool(given.get("partition"))
        out += check_cluster_partition(issues, site, res.partition, ours, rules.partitions)
        partition_ok = not out and issues.ok(("resources", "partition"))
    gpus_ok = issues.ok(("resources", "gpus_per_node"))
    if res.gpu_type is not None and partition_ok and gpus_ok:
        message = _gpu_problem(res, rules)
        site_key = _gpu_site_key(res, site, given)
        if message is not None:
            out += _report(issues, site, "gpus_per_node", site_key, message)
    if res.account is None and res.qos is None:
        return out
    assoc = rules.associations()
    if assoc is None:
        return out
    for key, message in association_problems(res.account, res.qos, assoc).items():
        out += _report(issues, site, key, None if given.get(key) else (key,), message)
    return out


def _report(
    issues: Issues, site: SiteConfig, key: str, site_key: tuple[str, ...] | None, message: str
) -> list[ConfigIssue]:
    """Add ``message`` at ``resources.<key>`` when the experiment set the value
    (``site_key`` None; nothing returned), else return it at the site file's ``site_key``."""
    if site_key is None:
        issues.add(("resources", key), message)
        return []
    return [site_issue(site, message, site_key)]


def _gpu_site_key(
    res: Resources, site: SiteConfig, given: Mapping[str, Any]
) -> tuple[str, ...] | None:
    """Where the site file set the applied type (``partitions.<p>.gpu_type``); None
    when the experiment typed its request."""
    if isinstance(given.get("gpus_per_node"), str):
        return None
    for part in (res.partition or "").split(","):
        info = site.partitions.get(part)
        if info is not None and info.gpu_type == res.gpu_type:
            return ("partitions", part, "gpu_type")
    return None


def _gpu_problem(res: Resources, rules: ClusterRules) -> str | None:
    wanted = res.gpu_type
    parts = res.partition.split(",") if res.partition else []
    if not parts:
        default = rules.default_partition()
        parts = [default] if default else sorted(rules.partitions())
    for part in parts:
        offered = rules.gpu_types(part)
        if offered is None:
            continue
        types = sorted(set(offered))
        if wanted in types:
            continue
        hint = (
            f"(valid: {', '.join(types)})"
            if types
            else f"(valid: none; its GPUs are untyped: ask for gpus_per_node: {res.gpus_per_node})"
        )
        return (
            f"GPU type {wanted!r} is not on partition {part!r} of this Slurm cluster; "
            f"{did_you_mean(wanted or '', types)}{hint}"
        )
    return None


def association_problems(
    account: str | None, qos: str | None, assoc: Mapping[str, Collection[str]]
) -> dict[str, str]:
    """``{"account"|"qos": message}`` for an account the user has no association with,
    or a QOS none of the account's (else any of the user's) associations allows; each
    message lists the valid values. A QOS is not checked where the list is empty."""
    out: dict[str, str] = {}
    accounts = sorted(assoc)
    if account is not None and account not in assoc:
        out["account"] = (
            f"account {account!r} is not one of your Slurm associations; "
            f"{did_you_mean(account, accounts)}(valid: {', '.join(accounts) or 'none'})"
        )
        return out
    if qos is None:
        return out
    scope = [account] if account is not None else accounts
    allowed = sorted({q for a in scope for q in assoc[a]})
    if allowed and qos not in allowed:
        whose = f"account {account!r}" if account is not None else "your associations"
        out["qos"] = (
            f"QOS {qos!r} is not allowed for {whose}; "
            f"{did_you_mean(qos, allowed)}(valid: {', '.join(allowed)})"
        )
    return out
