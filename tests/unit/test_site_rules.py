"""Typed GPUs, GPU options in sbatch_args, and the Slurm cluster's rules.

The cluster's answers are faked at the command boundary: sinfo's ``%P|%G`` and
sacctmgr's ``account|qos`` lines as Slurm 22.05 and later print them.
"""

from __future__ import annotations

import textwrap
from collections.abc import Collection, Mapping
from pathlib import Path

import pytest

from dlhpc import config
from dlhpc.config.schema import PreemptionConfig, Resources, SiteConfig
from dlhpc.errors import ConfigError, SchedulerError
from dlhpc.scheduler import JobRequest
from dlhpc.scheduler.plugins import BackendTable
from dlhpc.scheduler.slurm.sbatch import sbatch_parameters
from dlhpc.scheduler.slurm.site import (
    SINFO_GRES,
    SlurmRules,
    associations_command,
    parse_associations,
    parse_sinfo_gres,
)
from dlhpc.search import SearcherTable

# sinfo --all --noheader --format=%P|%G, as printed by the dev cluster's versions.
SINFO_2205_UNTYPED = "debug*|gpu:2\nhigh|gpu:2\n"
SINFO_2205_TYPED = "debug*|gpu:a100:2\ndebug*|gpu:v100:2\nhigh|gpu:a100:2\nhigh|gpu:v100:2\n"
# 23.02+ with Cores= in gres.conf prints the socket binding; several gres per node.
SINFO_2411 = (
    "gpu*|gpu:a100:4(S:0-1)\n"
    "gpu*|gpu:h100:4(S:0,1),shard:a100:8\n"
    "cpu|(null)\n"
    "mixed|gpu:2(S:0),gpu:l40s:1(S:1)\n"
)
SACCTMGR = "dlhpc-lab|dlhpc-qos\ndlhpc-lab|dlhpc-qos,normal\nother|\n"


def test_parse_sinfo_gres_of_each_version() -> None:
    untyped = parse_sinfo_gres(SINFO_2205_UNTYPED)
    assert (untyped.default, dict(untyped.gpu_types)) == (
        "debug",
        {"debug": frozenset(), "high": frozenset()},
    )
    typed = parse_sinfo_gres(SINFO_2205_TYPED)
    assert typed.gpu_types["debug"] == {"a100", "v100"} == typed.gpu_types["high"]
    new = parse_sinfo_gres(SINFO_2411)
    assert new.default == "gpu"
    assert new.gpu_types == {
        "gpu": frozenset({"a100", "h100"}),  # shard:a100 is not a GPU request
        "cpu": frozenset(),
        "mixed": frozenset({"l40s"}),
    }
    bare = parse_sinfo_gres("debug\nhigh\n")  # no gres column at all
    assert sorted(bare.gpu_types) == ["debug", "high"] and bare.default is None


def test_parse_associations_merges_lines_of_one_account() -> None:
    assert parse_associations(SACCTMGR) == {
        "dlhpc-lab": frozenset({"dlhpc-qos", "normal"}),
        "other": frozenset(),
    }
    assert parse_associations("\n") == {}


class FakeRun:
    """Answers sinfo and sacctmgr; counts calls."""

    def __init__(
        self, sinfo: str = SINFO_2205_TYPED, sacctmgr: tuple[int, str, str] = (0, SACCTMGR, "")
    ) -> None:
        self.sinfo, self.sacctmgr = sinfo, sacctmgr
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str]) -> tuple[int, str, str]:
        self.calls.append(argv)
        if argv[0] == "sinfo":
            return 0, self.sinfo, ""
        if argv[0] == "sacctmgr":
            return self.sacctmgr
        raise AssertionError(argv)


def test_slurm_rules_read_each_command_once() -> None:
    run = FakeRun()
    rules = SlurmRules(run, user="dlhpc-user")
    assert rules.partitions() == ["debug", "high"]
    assert rules.default_partition() == "debug"
    assert rules.gpu_types("high") == {"a100", "v100"}
    assert rules.gpu_types("nope") == frozenset()
    assert rules.associations() == {"dlhpc-lab": {"dlhpc-qos", "normal"}, "other": frozenset()}
    assert rules.associations() is rules.associations()
    assert run.calls == [SINFO_GRES, associations_command("dlhpc-user")]
    assert "user=dlhpc-user" in run.calls[1] and rules.warnings == []


@pytest.mark.parametrize(
    ("answer", "warning"),
    [
        (
            (1, "", "sacctmgr: error: Problem talking to the database: Connection refused\n"),
            "sacctmgr failed (exit 1): sacctmgr: error: Problem talking to the database: "
            "Connection refused",
        ),
        ((0, "", ""), "sacctmgr lists no association for user 'u'"),
    ],
)
def test_no_accounting_skips_the_association_check_with_a_warning(
    answer: tuple[int, str, str], warning: str
) -> None:
    rules = SlurmRules(FakeRun(sacctmgr=answer), user="u")
    assert rules.associations() is None
    assert rules.warnings == [f"account and QOS not checked against Slurm: {warning}"]


def test_sacctmgr_missing_is_a_warning_and_sinfo_failing_an_error() -> None:
    def run(argv: list[str]) -> tuple[int, str, str]:
        if argv[0] == "sacctmgr":
            raise SchedulerError("sacctmgr cannot run: No such file or directory")
        return 1, "", "slurm_load_partitions: Unable to contact slurm controller\n"

    rules = SlurmRules(run, user="u")
    assert rules.associations() is None
    assert "sacctmgr cannot run" in rules.warnings[0]
    with pytest.raises(SchedulerError, match=r"sinfo failed \(exit 1\): slurm_load_partitions"):
        rules.partitions()


def test_the_slurm_backend_offers_its_rules() -> None:
    assert isinstance(BackendTable().get("slurm").cluster_rules(), SlurmRules)
    assert BackendTable().get("local").cluster_rules() is None


# --- the loader ----------------------------------------------------------------

SITE = """\
name: uni
backend: slurm
partition: gpu
account: lab
partitions:
  gpu: {gpus_per_node: 4, gpu_type: a100}
  mixed: {gpus_per_node: 4}
  cpu: {}
"""


class Rules:
    """ClusterRules from plain data."""

    def __init__(
        self,
        types: Mapping[str, Collection[str]],
        assoc: Mapping[str, Collection[str]] | None = None,
        default: str | None = None,
    ) -> None:
        self.types, self.assoc, self.default = types, assoc, default

    def partitions(self) -> Collection[str]:
        return list(self.types)

    def default_partition(self) -> str | None:
        return self.default

    def gpu_types(self, partition: str) -> Collection[str] | None:
        return self.types.get(partition, ())

    def associations(self) -> Mapping[str, Collection[str]] | None:
        return self.assoc


CLUSTER = Rules(
    {"gpu": {"a100"}, "mixed": {"a100", "v100"}, "cpu": ()},
    {"lab": {"normal", "long"}, "other": {"normal"}},
    default="gpu",
)


def _load(
    tmp_path: Path, resources: str, rules: Rules | None = CLUSTER, site: str = SITE
) -> config.ExperimentConfig:
    (tmp_path / "site.yaml").write_text(site)
    exp = tmp_path / "exp.yaml"
    exp.write_text(
        "name: t\nentrypoint: python t.py\nsite: site.yaml\nresources:\n"
        + textwrap.indent(textwrap.dedent(resources), "  ")
    )
    env = {"HOME": str(tmp_path), "PATH": "/nonexistent"}
    factory = None if rules is None else (lambda backend: rules if backend == "slurm" else None)
    return config.load_experiment(
        str(exp), environ=env, backends=BackendTable(), cluster=factory, searchers=SearcherTable()
    )


def _errors(
    tmp_path: Path, resources: str, rules: Rules | None = CLUSTER, site: str = SITE
) -> list[str]:
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, resources, rules, site)
    assert info.value.exit_code == 2
    return [str(i).replace(str(tmp_path) + "/", "") for i in info.value.issues]


def test_typed_and_site_typed_requests(tmp_path: Path) -> None:
    r = _load(tmp_path, "gpus_per_node: 2\n").resources  # partition gpu: the site's a100
    assert (r.gpus_per_node, r.gpu_type, r.tasks_per_node) == (2, "a100", 2)
    r = _load(tmp_path, "gpus_per_node: v100:3\npartition: mixed\n").resources
    assert (r.gpus_per_node, r.gpu_type, r.tasks_per_node) == (3, "v100", 3)
    r = _load(tmp_path, "gpus_per_node: 2\npartition: mixed\n").resources  # no site type
    assert (r.gpus_per_node, r.gpu_type) == (2, None)
    r = _load(tmp_path, "gpus_per_node: 0\n").resources
    assert (r.gpus_per_node, r.gpu_type) == (0, None)
    r = _load(tmp_path, "gpus_per_node: 1\npartition: gpu,mixed\n").resources  # they disagree
    assert r.gpu_type is None


def test_bad_gpu_requests_name_line_and_field(tmp_path: Path) -> None:
    assert _errors(tmp_path, "gpus_per_node: 'a100:0'\n") == [
        "exp.yaml:5: resources.gpus_per_node: the count of a typed request must be 1 to 1024, got 0"
    ]
    assert _errors(tmp_path, "gpus_per_node: a100\n", rules=None) == [
        "exp.yaml:5: resources.gpus_per_node: must be a GPU count (e.g. 2) or a GPU type and "
        "count (e.g. 'a100:2'), got 'a100'"
    ]
    assert _errors(tmp_path, "gpus_per_node: v100:2\n", rules=None) == [
        "exp.yaml:5: resources.gpus_per_node: partition 'gpu' has GPUs of type 'a100' "
        "(site 'uni'), got 'v100'"
    ]


def test_an_unknown_gpu_type_lists_the_valid_ones(tmp_path: Path) -> None:
    assert _errors(tmp_path, "gpus_per_node: h100:2\npartition: mixed\n") == [
        "exp.yaml:5: resources.gpus_per_node: GPU type 'h100' is not on partition 'mixed' of "
        "this Slurm cluster; did you mean 'v100'? (valid: a100, v100)"
    ]
    untyped = Rules({"gpu": (), "mixed": ()}, None, default="gpu")
    assert _errors(tmp_path, "gpus_per_node: a100:2\npartition: mixed\n", untyped) == [
        "exp.yaml:5: resources.gpus_per_node: GPU type 'a100' is not on partition 'mixed' of "
        "this Slurm cluster; (valid: none; its GPUs are untyped: ask for gpus_per_node: 2)"
    ]
    # the type came from the site file: the problem is there, at the partition's gpu_type
    assert _errors(tmp_path, "gpus_per_node: 2\n", untyped) == [
        "site.yaml:6: partitions.gpu.gpu_type: GPU type 'a100' is not on partition 'gpu' of "
        "this Slurm cluster; (valid: none; its GPUs are untyped: ask for gpus_per_node: 2)"
    ]


def test_an_unknown_partition_is_reported_once(tmp_path: Path) -> None:
    assert _errors(
        tmp_path, "gpus_per_node: a100:2\npartition: nope\n", site="backend: slurm\n"
    ) == [
        "exp.yaml:6: resources.partition: partition 'nope' does not exist on this Slurm "
        "cluster; (valid: cpu, gpu, mixed)"
    ]


def test_account_and_qos_against_the_associations(tmp_path: Path) -> None:
    assert _errors(tmp_path, "account: lan\n") == [
        "exp.yaml:5: resources.account: account 'lan' is not one of your Slurm associations; "
        "(valid: lab, other)"
    ]
    assert _errors(tmp_path, "qos: long\naccount: other\n") == [
        "exp.yaml:5: resources.qos: QOS 'long' is not allowed for account 'other'; (valid: normal)"
    ]
    assert _errors(tmp_path, "qos: high\n") == [  # the site's account lab
        "exp.yaml:5: resources.qos: QOS 'high' is not allowed for account 'lab'; "
        "(valid: long, normal)"
    ]
    assert _errors(tmp_path, "mem: 1G\n", site=SITE.replace("account: lab", "account: gone")) == [
        "site.yaml:4: account: account 'gone' is not one of your Slurm associations; "
        "(valid: lab, other)"
    ]
    assert _load(tmp_path, "qos: long\n").resources.qos == "long"


def test_without_accounting_the_account_is_not_checked(tmp_path: Path) -> None:
    no_acct = Rules({"gpu": {"a100"}}, None)
    assert _load(tmp_path, "account: anything\nqos: any\n", no_acct).resources.account == "anything"


# --- sbatch_args and the rendered request -----------------------------------------


@pytest.mark.parametrize(
    ("arg", "option"),
    [
        ("--gres=gpu:2", "--gres=gpu:2"),
        ("--gres=gpu:a100:1,nvme:1", "--gres=gpu:a100:1,nvme:1"),
        ("--gpus=2", "--gpus"),
        ("--gpus-per-node=a100:2", "--gpus-per-node"),
        ("--gpus-per-task=1", "--gpus-per-task"),
        ("--gpus-per-n=1", "--gpus-per-n"),
        ("-G2", "-G"),
        ("--tres-per-task=gres/gpu:1", "--tres-per-task=gres/gpu:1"),
    ],
)
def test_a_gpu_request_in_sbatch_args_is_a_config_error(
    tmp_path: Path, arg: str, option: str
) -> None:
    assert _errors(tmp_path, f"sbatch_args: [--exclusive, '{arg}']\n", rules=None) == [
        f"exp.yaml:5: resources.sbatch_args[1]: {option} requests GPUs, which "
        "resources.gpus_per_node already does (2, or a typed a100:2); remove it"
    ]


def test_other_gpu_options_pass(tmp_path: Path) -> None:
    args = "['--gres=nvme:1', '--gpu-bind=closest', '--cpus-per-gpu=4', '--gres-flags=x']"
    r = _load(tmp_path, f"sbatch_args: {args}\n", rules=None).resources
    assert len(r.sbatch_args) == 4


def _flags(res: Resources, gpu_request: str = "gpus-per-node") -> dict[str, object]:
    site = SiteConfig("s", None, gpu_request=gpu_request)  # type: ignore[arg-type]
    req = JobRequest(
        experiment_id=1,
        name="dlhpc-e1-x",
        folder=Path("/tmp/j"),
        trial_dirs=[Path("/tmp/t")],
        resources=res,
        preemption=PreemptionConfig(),
        site=site,
        max_concurrent=0,
    )
    params = sbatch_parameters(req, 1, 0)
    extra = params.pop("additional_parameters")
    assert isinstance(extra, dict)
    return {**{k: v for k, v in params.items() if "gpu" in k or k == "gres"}, **extra}


def test_rendered_gpu_request_as_the_site_says() -> None:
    typed = Resources(gpus_per_node=2, gpu_type="a100")
    assert _flags(typed)["gpus_per_node"] == "a100:2"
    assert _flags(Resources(gpus_per_node=2))["gpus_per_node"] == "2"
    gres = _flags(typed, "gres")
    assert gres["gres"] == "gpu:a100:2" and "gpus_per_node" not in gres
    merged = _flags(Resources(gpus_per_node=1, sbatch_args=("--gres=nvme:1",)), "gres")
    assert merged["gres"] == "gpu:1,nvme:1"
    assert "gres" not in _flags(Resources()) and "gpus_per_node" not in _flags(Resources())
    kept = _flags(Resources(sbatch_args=("--gres=nvme:1",)), "gres")  # no GPUs: theirs alone
    assert kept["gres"] == "nvme:1"


def test_site_gpu_request_option(tmp_path: Path) -> None:
    r = _load(tmp_path, "gpus_per_node: 1\n", site=SITE + "gpu_request: gres\n", rules=None)
    assert r.site.gpu_request == "gres"
    assert _errors(tmp_path, "mem: 1G\n", site=SITE + "gpu_request: gpus\n", rules=None) == [
        "site.yaml:9: gpu_request: must be one of gpus-per-node, gres, got 'gpus'"
    ]


def test_doctor_checks_the_sites_gpu_types_account_and_qos() -> None:
    from dlhpc.config.schema import PartitionInfo
    from dlhpc.scheduler.slurm.site import doctor_checks

    parts = {"debug": PartitionInfo("debug", 2, "a100"), "high": PartitionInfo("high", 2, "h100")}
    site = SiteConfig("s", None, account="dlhpc-lab", qos="dlhpc-qos", partitions=parts)
    checks = doctor_checks(site, SlurmRules(FakeRun(), user="u"))
    assert [(c.name, c.status, c.detail) for c in checks] == [
        ("site GPU types", "fail", "high: 'h100' not among a100, v100"),
        ("site account and QOS", "ok", "dlhpc-lab / dlhpc-qos"),
    ]
    down = SlurmRules(FakeRun(sinfo=SINFO_2205_UNTYPED, sacctmgr=(1, "", "no db")), user="u")
    checks = doctor_checks(SiteConfig("s", None, qos="x", partitions=parts), down)
    assert [(c.name, c.status) for c in checks] == [
        ("site GPU types", "fail"),
        ("site account and QOS", "warn"),
    ]
    assert "sacctmgr failed (exit 1): no db" in checks[1].detail
    assert doctor_checks(SiteConfig("s", None), down) == []
