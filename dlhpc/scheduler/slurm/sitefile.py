"""The site file ``dlhpc site init`` writes, from what
:func:`~dlhpc.scheduler.slurm.discover.read_cluster` read.

:func:`render_site` returns YAML that :func:`dlhpc.config.load_site` reads as it is:
every value has a comment naming the command (and the words) it came from, and what
the cluster cannot tell (modules, a GPU type where a partition's nodes differ, an
account sacctmgr would not list) is a comment line starting ``EDIT:``. String values
are written as JSON strings (valid YAML), so that no name reads as a number or a boolean.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dlhpc.config import parse_slurm_time
from dlhpc.scheduler.slurm.discover import Accounting, ClusterFacts, Partition
from dlhpc.scheduler.slurm.limits import Limits

__all__ = ["Folder", "render_site"]

_PLAIN_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*")


@dataclass(frozen=True)
class Folder:
    """A candidate checkpoint folder, writable by the user, and where it was found
    (``$SCRATCH``, ``lustre mount /lustre (/proc/mounts)``)."""

    path: Path
    source: str


def _str(value: str) -> str:
    return json.dumps(value)


def _key(name: str) -> str:
    return name if _PLAIN_KEY.fullmatch(name) else json.dumps(name)


def _header(name: str, facts: ClusterFacts) -> list[str]:
    cluster = facts.config.get("ClusterName", "") or "(unnamed)"
    version = facts.config.get("SLURM_VERSION", "") or "unknown"
    return [
        f"# Site {name}: Slurm cluster {cluster} (Slurm {version}), as user {facts.user} sees it.",
        "# Written by `dlhpc site init` from scontrol show config, scontrol show partition,",
        "# sinfo and, where accounting exists, sacctmgr. Each value says where it came from;",
        "# the EDIT lines are what the cluster cannot tell. Check the file with",
        f"# `dlhpc doctor --site {name}`.",
        f"name: {_str(name)}",
        "backend: slurm",
        "",
    ]


def _features(facts: ClusterFacts) -> list[str]:
    select = facts.config.get("SelectType", "") or "unset"
    form = "gpus-per-node" if facts.cons_tres.status == "ok" else "gres"
    scron = "available" if facts.scrontab.status == "ok" else "not available"
    size = facts.max_array_size
    lines = [
        f"# SelectType={select} (scontrol show config): "
        + (
            "--gpus-per-node=[TYPE:]N works"
            if form == "gpus-per-node"
            else "--gpus-per-node needs select/cons_tres, so GPUs are asked with --gres"
        ),
        f"gpu_request: {form}",
        f"# scrontab: {scron} ({facts.scrontab.detail})",
    ]
    if size:
        lines += [
            f"# MaxArraySize={size} (scontrol show config): dlhpc reads it at every launch;",
            "# set max_array_size lower only if your admins ask for smaller job arrays.",
            f"# max_array_size: {size}",
        ]
    else:
        lines.append("# MaxArraySize: scontrol show config does not say (dlhpc assumes Slurm's)")
    return [*lines, ""]


def _time(p: Partition) -> list[str]:
    try:
        parse_slurm_time(p.max_time, allow_unlimited=True)
    except ValueError:
        return [
            f"    # EDIT: max_time: MaxTime={p.max_time} (scontrol show partition) is not a time"
            " dlhpc reads; write the partition's limit as D-HH:MM:SS"
        ]
    return [f"    max_time: {_str(p.max_time)}  # MaxTime (scontrol show partition)"]


def _gpus(p: Partition) -> list[str]:
    lines = [f"    gpus_per_node: {p.gpus_per_node}  # the most on one node (sinfo %G)"]
    if len(p.gpu_types) == 1:
        lines.append(f"    gpu_type: {_str(p.gpu_types[0])}  # the nodes' gres type (sinfo %G)")
    elif p.gpu_types:
        lines.append(
            f"    # EDIT: gpu_type: the nodes have {', '.join(p.gpu_types)} (sinfo %G); set the"
            " type a plain GPU count asks for"
        )
    elif p.gpus_per_node:
        lines.append("    # untyped GPUs (sinfo %G: gpu:N): no gpu_type")
    return lines


def _preemption(p: Partition, facts: ClusterFacts) -> list[str]:
    kind, mode = facts.preempt_type, p.settings.get("PreemptMode", "") or "unset"
    if kind == "preempt/partition_prio":
        if p.higher and mode.upper() != "OFF":
            why = f"PreemptMode={mode}; {', '.join(p.higher)} has a higher PriorityTier"
            return [f"    preemptible: true  # {kind}, {why} (scontrol)"]
        why = "PreemptMode=OFF" if mode.upper() == "OFF" else "no partition of a higher tier"
        return [f"    preemptible: false  # {kind}, {why} (scontrol)"]
    if kind == "preempt/none":
        return ["    preemptible: false  # PreemptType=preempt/none (scontrol show config)"]
    return [
        "    preemptible: false",
        f"    # EDIT: preemptible: PreemptType={kind} (scontrol show config) preempts by QOS;"
        " set true where your jobs here can be preempted",
    ]


def _partitions(facts: ClusterFacts) -> list[str]:
    names = [p.name for p in facts.partitions]
    lines = []
    if facts.default_partition in names:
        where = "Default=YES (scontrol show partition)"
        lines += [f"partition: {_str(facts.default_partition or '')}  # {where}"]
    else:
        lines.append("# partition: none set; Slurm's default partition is not among those below")
    lines.append("partitions:")
    for p in facts.partitions:
        state = p.settings.get("State", "") or "unknown"
        nodes = p.settings.get("Nodes", "") or "none"
        lines.append(f"  {_key(p.name)}:  # Nodes={nodes} State={state}")
        lines += [*_gpus(p), *_time(p), *_preemption(p, facts)]
    return [*lines, ""]


def _accounts(acct: Accounting) -> list[str]:
    where = f"AccountingStorageType={acct.storage} (scontrol show config)"
    if acct.limits is None and "slurmdbd" not in acct.storage:
        return [
            f"# No accounting: {where}: no account, QOS",
            "# or limit to read (sacctmgr not asked), and Slurm takes jobs without an account.",
            "",
        ]
    if acct.limits is None:
        return [
            f"# Accounting: {where},",
            f"# AccountingStorageEnforce={acct.enforce}.",
            f"# EDIT: account: sacctmgr could not tell your accounts ({acct.problem});"
            " set your group's Slurm account if jobs need one",
            "",
        ]
    return [
        f"# Accounting: {where},",
        f"# AccountingStorageEnforce={acct.enforce}.",
        *_limits(acct.limits),
        *_account(acct, acct.limits),
        "",
    ]


def _limits(limits: Limits) -> list[str]:
    """One line per account and QOS of the user's associations: the limits that bind."""
    lines = ["# Your accounts and QOS, and the limits that bind (sacctmgr show assoc, show qos;"]
    lines.append("# dlhpc reads them again at every launch):")
    for account in sorted({a.account for a in limits.associations}):
        assocs = [a for a in limits.associations if a.account == account]
        default = next((a.default_qos for a in assocs if a.default_qos), "")
        allowed = {q for a in assocs for q in a.qos} | ({default} - {""})
        names: Sequence[str | None] = sorted(allowed) or [None]
        for qos in names:
            mark = " (default)" if qos == default else ""
            binding = limits.describe(account, qos)
            lines.append(f"#   {account} / {qos or 'no QOS'}{mark}: {binding}")
    return lines


def _account(acct: Accounting, limits: Limits) -> list[str]:
    account = acct.default_account
    needed = "associations" in acct.enforce.split(",")
    why = "jobs need an association (AccountingStorageEnforce)" if needed else "optional"
    if account is None or account not in {a.account for a in limits.associations}:
        return [f"# EDIT: account: sacctmgr shows no default account among these; set one ({why})"]
    return [
        f"account: {_str(account)}  # your DefaultAccount (sacctmgr show user); {why}",
        "# qos: unset, Slurm uses the association's default QOS; set one of those above to choose",
    ]


def _folders(folders: Sequence[Folder]) -> list[str]:
    lines = ["# Checkpoints: a parallel filesystem folder the compute nodes see."]
    if not folders:
        return [
            *lines,
            "# EDIT: scratch: no $SCRATCH, $WORK or writable Lustre/GPFS/NFS mount found; set"
            " your folder on the parallel filesystem (default: <state_dir>/scratch)",
            "",
        ]
    lines.append("# Candidates writable by you (the first is used):")
    lines += [f"#   {f.path}  ({f.source})" for f in folders]
    first = folders[0]
    return [
        *lines,
        f"scratch: {_str(str(first.path / 'dlhpc'))}  # under {first.source}, as its value here",
        "",
    ]


_TAIL = [
    "# state_dir: ~/.dlhpc (the default; $DLHPC_HOME wins): the database and run folders,",
    "# which the compute nodes must see; `dlhpc doctor` names its filesystem.",
    "journal_mode: delete  # safe on NFS and Lustre (wal only on a local disk)",
    "",
    "# EDIT: modules: the shell lines each job runs first (e.g. module load cuda/12.1), if any",
    "# EDIT: env: variables every job needs (e.g. NCCL_SOCKET_IFNAME: ib0), if any",
]


def render_site(name: str, facts: ClusterFacts, folders: Sequence[Folder]) -> str:
    """The site file ``name`` (see the module doc); ``folders``: checkpoint candidates,
    the best first."""
    lines = [
        *_header(name, facts),
        *_features(facts),
        *_partitions(facts),
        *_accounts(facts.accounting),
        *_folders(folders),
        *_TAIL,
    ]
    return "\n".join(lines) + "\n"
