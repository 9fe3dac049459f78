"""``dlhpc site init``: the site file rendered from Slurm's answers, faked at the command
boundary with what the dev cluster's Slurm 26.05 printed (strict and noacct profiles)
and variants of it (typed single-GPU partitions, cons_res, preempt/qos, no sacctmgr).
Every rendered file must load as a site unchanged."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from dlhpc.cli import _site
from dlhpc.cli._doctor import read_mounts
from dlhpc.cli.main import cli
from dlhpc.config import SiteConfig, load_site, site_search_path
from dlhpc.errors import SchedulerError, UsageError
from dlhpc.scheduler.plugins import BackendTable
from dlhpc.scheduler.slurm.discover import (
    SCONTROL_CONFIG,
    SCONTROL_PARTITIONS,
    ClusterFacts,
    default_account_command,
    parse_partitions,
    read_cluster,
)
from dlhpc.scheduler.slurm.limits import ASSOC_FORMAT, QOS_FORMAT
from dlhpc.scheduler.slurm.site import SINFO_GRES, parse_sinfo_gres
from dlhpc.scheduler.slurm.sitefile import Folder, render_site

# trimmed from `scontrol show config` of the dev cluster's Slurm 26.05.5, strict profile
CONFIG_STRICT = """Configuration data as of 2026-11-28T15:20:00
AccountingStorageEnforce = associations,limits,qos
AccountingStorageType   = accounting_storage/slurmdbd
ClusterName             = dlhpc-dev
JobRequeue              = 1
JobSubmitPlugins        = lua
MaxArraySize            = 1001
PreemptMode             = REQUEUE
PreemptType             = preempt/partition_prio
ScronParameters         = enable
SelectType              = select/cons_tres
SLURM_VERSION           = 26.05.5
"""
# Slurm 26.05's noacct profile prints no storage type at all
CONFIG_NOACCT = CONFIG_STRICT.replace("associations,limits,qos", "none").replace(
    "accounting_storage/slurmdbd", "(null)"
)
# an older site: cons_res, no scrontab, QOS-based preemption, no MaxArraySize line
CONFIG_OLD = """ClusterName             = oldhpc
AccountingStorageType   = accounting_storage/slurmdbd
AccountingStorageEnforce = none
PreemptType             = preempt/qos
SelectType              = select/cons_res
SLURM_VERSION           = 20.02.7
"""

_WORDS = (
    "AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL QoS=N/A DefaultTime=NONE"
    " Hidden=NO MaxNodes=UNLIMITED MinNodes=0 OverSubscribe=NO State=UP TotalCPUs=16"
    " TRES=cpu=16,mem=32000M,node=2,billing=16,gres/gpu=4"
)
PARTITIONS = (
    f"PartitionName=debug {_WORDS} Default=YES MaxTime=UNLIMITED Nodes=node[1-2]"
    " PriorityTier=1 PreemptMode=REQUEUE GraceTime=30\n"
    f"PartitionName=high {_WORDS} Default=NO MaxTime=UNLIMITED Nodes=node[1-2]"
    " PriorityTier=10 PreemptMode=OFF GraceTime=0\n"
)
PARTITIONS_OLD = (
    f"PartitionName=a100 {_WORDS} Default=YES MaxTime=2-00:00:00 Nodes=g[01-04]\n"
    f"PartitionName=cpu {_WORDS} Default=NO MaxTime=7-00:00:00 Nodes=c[01-40]\n"
    f"PartitionName=odd {_WORDS} Default=NO MaxTime=soon Nodes=x1\n"
)
SINFO_STRICT = "debug*|gpu:a100:2\ndebug*|gpu:v100:2\nhigh|gpu:a100:2\nhigh|gpu:v100:2\n"
SINFO_UNTYPED = "debug*|gpu:2\nhigh|gpu:2\n"
SINFO_OLD = "a100*|gpu:a100:4(S:0-1)\na100*|gpu:a100:8(S:0-1)\ncpu|(null)\nodd|(null)\n"
ASSOC_STRICT = "dlhpc-lab||dlhpc-qos|dlhpc-qos||||\n"
QOS_STRICT = "normal||||\ndlhpc-qos|8|4|02:00:00|\n"

USER = "dlhpc-user"
SACCT = ["sacctmgr", "-n", "-P", "show"]
ASSOC = (*SACCT, "assoc", f"user={USER}", f"format={ASSOC_FORMAT}")
QOS = (*SACCT, "qos", f"format={QOS_FORMAT}")


class FakeSlurm:
    """Slurm's commands by argv; ``calls`` counts them; an argv not given fails the test."""

    def __init__(self, answers: dict[tuple[str, ...], tuple[int, str, str]]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, argv: list[str]) -> tuple[int, str, str]:
        self.calls.append(tuple(argv))
        assert tuple(argv) in self.answers, f"unexpected command {argv}"
        return self.answers[tuple(argv)]


def _slurm(config: str, partitions: str, sinfo: str, **sacctmgr: str | None) -> FakeSlurm:
    answers = {
        tuple(SCONTROL_CONFIG): (0, config, ""),
        tuple(SCONTROL_PARTITIONS): (0, partitions, ""),
        tuple(SINFO_GRES): (0, sinfo, ""),
    }
    fail = (1, "", "sacctmgr: error: Problem talking to the database: Connection refused")
    for argv, key in (
        (ASSOC, "assoc"),
        (QOS, "qos"),
        (tuple(default_account_command(USER)), "default"),
    ):
        if key in sacctmgr:
            value = sacctmgr[key]
            answers[argv] = fail if value is None else (0, value, "")
    return FakeSlurm(answers)


def strict() -> FakeSlurm:
    return _slurm(
        CONFIG_STRICT,
        PARTITIONS,
        SINFO_STRICT,
        assoc=ASSOC_STRICT,
        qos=QOS_STRICT,
        default="dlhpc-lab\n",
    )


def _load(tmp_path: Path, text: str, name: str = "x") -> SiteConfig:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    env = {"HOME": str(tmp_path), "PATH": os.defpath}
    return load_site(str(path), environ=env, backends=BackendTable())


def _edits(text: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines() if ln.strip().startswith("# EDIT:")]


def test_strict_cluster_is_read_with_one_call_per_command_and_renders_a_loadable_site(
    tmp_path: Path,
) -> None:
    slurm = strict()
    facts = read_cluster(slurm, user=USER)
    assert sorted(slurm.calls) == sorted(slurm.answers)  # each once, nothing else
    text = render_site("strict", facts, [])
    site = _load(tmp_path, text, "strict")
    assert (site.name, site.backend, site.partition, site.gpu_request) == (
        "strict",
        "slurm",
        "debug",
        "gpus-per-node",
    )
    assert (site.account, site.qos) == ("dlhpc-lab", None)
    debug, high = site.partitions["debug"], site.partitions["high"]
    assert (debug.gpus_per_node, debug.gpu_type, debug.max_time_minutes) == (2, None, None)
    assert (debug.preemptible, high.preemptible) == (True, False)
    assert site.max_array_size is None
    assert "# max_array_size: 1001" in text and "MaxArraySize=1001" in text
    assert "MaxSubmitJobs 8, MaxJobs 4, MaxWall 02:00:00" in text  # the QOS limits
    assert "jobs need an association" in text
    assert "scrontab: available" in text
    edits = _edits(text)
    assert sum("gpu_type" in e and "a100, v100" in e for e in edits) == 2  # mixed node types
    assert any(e.startswith("# EDIT: scratch:") for e in edits)
    assert not any("account" in e for e in edits)


def test_a_partition_of_one_gpu_type_gets_it_and_the_most_gpus_of_a_node(tmp_path: Path) -> None:
    slurm = _slurm(CONFIG_OLD, PARTITIONS_OLD, SINFO_OLD, assoc=None)
    facts = read_cluster(slurm, user=USER)
    text = render_site("old", facts, [])
    site = _load(tmp_path, text, "old")
    a100, cpu = site.partitions["a100"], site.partitions["cpu"]
    assert (a100.gpus_per_node, a100.gpu_type, a100.max_time_minutes) == (8, "a100", 2880)
    assert (cpu.gpus_per_node, cpu.gpu_type, cpu.max_time_minutes) == (0, None, 7 * 1440)
    assert site.partitions["odd"].max_time_minutes is None  # not written: an EDIT line
    assert site.gpu_request == "gres"  # cons_res: --gpus-per-node does not work
    assert "scrontab: not available" in text
    assert "# MaxArraySize: scontrol show config does not say" in text
    edits = _edits(text)
    assert any("max_time: MaxTime=soon" in e for e in edits)
    assert sum("preemptible: PreemptType=preempt/qos" in e for e in edits) == 3
    assert any(e.startswith("# EDIT: account:") and "Connection refused" in e for e in edits)
    assert site.account is None


def test_without_accounting_sacctmgr_is_not_asked(tmp_path: Path) -> None:
    slurm = _slurm(CONFIG_NOACCT, PARTITIONS, SINFO_UNTYPED)  # any sacctmgr fails the test
    text = render_site("noacct", read_cluster(slurm, user=USER), [])
    assert not any(argv[0] == "sacctmgr" for argv in slurm.calls)
    site = _load(tmp_path, text, "noacct")
    assert (site.account, site.qos) == (None, None)
    assert site.partitions["debug"].gpus_per_node == 2
    assert site.partitions["debug"].gpu_type is None
    assert "No accounting: AccountingStorageType=(null) (scontrol show config)" in text
    assert "untyped GPUs" in text
    assert not any("account" in e for e in _edits(text))


def test_no_default_account_among_the_associations_is_an_edit_line(tmp_path: Path) -> None:
    slurm = _slurm(
        CONFIG_STRICT, PARTITIONS, SINFO_STRICT, assoc=ASSOC_STRICT, qos=QOS_STRICT, default=""
    )
    text = render_site("x", read_cluster(slurm, user=USER), [])
    assert _load(tmp_path, text).account is None
    assert any(e.startswith("# EDIT: account:") for e in _edits(text))


def test_a_user_name_unsafe_for_sacctmgr_is_an_edit_line(tmp_path: Path) -> None:
    slurm = strict()
    text = render_site("x", read_cluster(slurm, user="a b"), [])
    assert not any(argv[0] == "sacctmgr" for argv in slurm.calls)
    assert _load(tmp_path, text).account is None
    assert any("unsafe user name 'a b'" in e for e in _edits(text))


def test_only_the_partitions_asked_for(tmp_path: Path) -> None:
    facts = read_cluster(strict(), user=USER, only=["high"])
    text = render_site("x", facts, [])
    site = _load(tmp_path, text)
    assert list(site.partitions) == ["high"]
    assert site.partition is None  # the cluster's default is not listed
    with pytest.raises(UsageError, match="--partition nope: not on this cluster"):
        read_cluster(strict(), user=USER, only=["high", "nope"])


def test_a_failing_scontrol_is_a_scheduler_error() -> None:
    slurm = strict()
    slurm.answers[tuple(SCONTROL_CONFIG)] = (1, "", "slurm_load_ctl_conf error: Unable to contact")
    with pytest.raises(SchedulerError, match="scontrol show config failed.*Unable to contact"):
        read_cluster(slurm, user=USER)


def test_scratch_is_the_first_candidate_with_its_source(tmp_path: Path) -> None:
    facts = read_cluster(strict(), user=USER)
    folders = [Folder(tmp_path / "s", "$SCRATCH"), Folder(tmp_path / "l", "lustre mount /l")]
    text = render_site("x", facts, folders)
    site = _load(tmp_path, text)
    assert site.scratch == tmp_path / "s" / "dlhpc"
    assert f"#   {tmp_path / 'l'}  (lustre mount /l)" in text
    assert not any(e.startswith("# EDIT: scratch:") for e in _edits(text))


def test_parsers_of_partitions_and_gpu_counts() -> None:
    parts = parse_partitions(PARTITIONS + "\nnot a partition line\n")
    assert list(parts) == ["debug", "high"]
    assert parts["debug"]["TRES"] == "cpu=16,mem=32000M,node=2,billing=16,gres/gpu=4"
    counts = parse_sinfo_gres(
        SINFO_OLD + "mixed|gpu:2(S:0),gpu:l40s:1(S:1),shard:a100:8\nbare|gpu\n"
    ).gpu_counts
    assert counts == {"a100": 8, "cpu": 0, "odd": 0, "mixed": 3, "bare": 1}


MOUNTS = """\
proc /proc proc rw 0 0
srv:/home {root}/home nfs4 rw,relatime 0 0
lfs@o2ib:/lfs {root}/lustre lustre rw,flock 0 0
gpfs0 {root}/gpfs gpfs rw 0 0
srv:/ro {root}/ro nfs rw 0 0
/dev/sda1 {root}/local ext4 rw 0 0
"""


def test_scratch_candidates(tmp_path: Path) -> None:
    for folder in ("home/me", "lustre/me", "gpfs", "ro", "local", "scr"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "ro").chmod(0o555)
    mounts = read_mounts(MOUNTS.format(root=tmp_path))
    env = {"SCRATCH": str(tmp_path / "scr"), "WORK": str(tmp_path / "missing")}
    found = _site.scratch_candidates(env, mounts, "me", tmp_path / "home" / "me")
    expected = [
        (tmp_path / "scr", "$SCRATCH"),
        (tmp_path / "lustre" / "me", f"lustre mount {tmp_path}/lustre in /proc/mounts"),
        (tmp_path / "gpfs", f"gpfs mount {tmp_path}/gpfs in /proc/mounts"),
    ]
    if os.geteuid() == 0:  # root writes to a 0555 folder
        expected.append((tmp_path / "ro", f"nfs mount {tmp_path}/ro in /proc/mounts"))
    assert [(f.path, f.source) for f in found] == expected
    twice = _site.scratch_candidates({"SCRATCH": str(tmp_path / "gpfs")}, mounts, "me", tmp_path)
    assert [f.source for f in twice if f.path == tmp_path / "gpfs"] == ["$SCRATCH"]


def _facts() -> ClusterFacts:
    return read_cluster(strict(), user=USER)


def test_cli_writes_the_users_site_and_never_overwrites_without_force(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("SCRATCH", raising=False)
    monkeypatch.delenv("WORK", raising=False)
    monkeypatch.setattr(_site, "read_cluster", lambda only: _facts())
    folder = tmp_path / ".config" / "dlhpc" / "sites"
    assert folder in site_search_path({"HOME": str(tmp_path)})
    runner = CliRunner()
    first = runner.invoke(cli, ["site", "init"])  # NAME: the ClusterName
    assert first.exit_code == 0, first.output
    written = (folder / "dlhpc-dev.yaml").read_text()
    assert f"wrote {folder / 'dlhpc-dev.yaml'} (2 partition(s))" in first.output
    assert "EDIT: scratch:" in first.output and "dlhpc doctor --site dlhpc-dev" in first.output
    (folder / "dlhpc-dev.yaml").write_text("# mine\n")
    again = runner.invoke(cli, ["site", "init", "dlhpc-dev"])
    assert again.exit_code == 2
    assert "exists; not replaced (--force replaces it" in again.output
    assert (folder / "dlhpc-dev.yaml").read_text() == "# mine\n"
    forced = runner.invoke(cli, ["site", "init", "dlhpc-dev", "--force"])
    assert forced.exit_code == 0, forced.output
    assert (folder / "dlhpc-dev.yaml").read_text() == written
    assert sorted(p.name for p in folder.iterdir()) == ["dlhpc-dev.yaml"]  # no temp file left
    bad = runner.invoke(cli, ["site", "init", "../x"])
    assert bad.exit_code == 2 and "not a site name" in bad.output
