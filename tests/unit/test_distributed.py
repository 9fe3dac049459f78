"""The rank environment derived from Slurm's variables, and its use by the worker."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from dlhpc.errors import DlhpcError
from dlhpc.harness import distributed as d
from dlhpc.harness.worker import _child_env
from dlhpc.protocol import TrialSpec
from dlhpc.scheduler.slurm import hostlist
from tests.unit._spec import make_spec


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("node1", ["node1"]),
        ("node[1-2]", ["node1", "node2"]),
        ("gpu[01-03,07]", ["gpu01", "gpu02", "gpu03", "gpu07"]),
        ("a1,b[8-10]", ["a1", "b8", "b9", "b10"]),
        ("rack[1-2]-n[3,5]", ["rack1-n3", "rack1-n5", "rack2-n3", "rack2-n5"]),
        ("n[9-11]x,m", ["n9x", "n10x", "n11x", "m"]),
        ("c[098-100]", ["c098", "c099", "c100"]),
    ],
)
def test_hostlists_expand_like_scontrol_show_hostnames(text: str, hosts: list[str]) -> None:
    assert hostlist.expand_hostlist(text) == hosts
    assert hostlist.first_host(text) == hosts[0]


@pytest.mark.parametrize("bad", ["node[1-2", "node1-2]", "node[2-1]", "node[a-b]", "", ","])
def test_malformed_hostlists_raise(bad: str) -> None:
    with pytest.raises(ValueError):
        hostlist.first_host(bad)


def test_tasks_per_node_gives_each_node_its_local_world_size() -> None:
    assert [hostlist.local_world_size("2(x3),1", n) for n in range(4)] == [2, 2, 2, 1]
    assert hostlist.local_world_size("4", 0) == 4
    with pytest.raises(ValueError):
        hostlist.local_world_size("2(x2)", 2)
    with pytest.raises(ValueError):
        hostlist.local_world_size("two", 0)


def test_master_port_differs_between_array_tasks_and_can_be_overridden() -> None:
    ports = {d.master_port(str(job), {}) for job in range(4100, 4164)}  # 64 array tasks
    assert len(ports) == 64 and all(20000 <= p < 40000 for p in ports)
    assert d.master_port("123_4", {}) == d.master_port("123", {}) == 20123
    assert d.master_port("123", {"DLHPC_MASTER_PORT": "29500"}) == 29500
    with pytest.raises(DlhpcError):
        d.master_port("123", {"DLHPC_MASTER_PORT": "http"})


def _slurm(**extra: str) -> dict[str, str]:
    env = {
        "SLURM_PROCID": "3",
        "SLURM_NTASKS": "4",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "1",
        "SLURM_TASKS_PER_NODE": "2(x2)",
        "SLURM_JOB_NODELIST": "localhost,other",
        "SLURM_JOB_ID": "4242",
    }
    env.update(extra)
    return env


def test_slurm_task_variables_become_torch_distributed_ones() -> None:
    assert d.rank_env(_slurm()) == {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": socket.gethostbyname("localhost"),
        "MASTER_PORT": "24242",
    }
    step = d.rank_env(_slurm(SLURM_STEP_NODELIST="localhost", SLURM_STEP_NUM_TASKS="4"))
    assert step["MASTER_ADDR"] == socket.gethostbyname("localhost")


def test_outside_an_srun_task_nothing_is_derived_and_contradictions_raise() -> None:
    assert d.rank_env({"SLURM_JOB_ID": "1"}) == {}
    with pytest.raises(DlhpcError, match="inconsistent"):
        d.rank_env(_slurm(SLURM_PROCID="4"))
    with pytest.raises(DlhpcError, match="host list"):
        d.rank_env(_slurm(SLURM_JOB_NODELIST="node[1-"))


def test_an_unresolvable_host_is_passed_on_by_name() -> None:
    assert d.resolve_host("no-such-host.invalid") == "no-such-host.invalid"


def test_single_process_env_picks_a_free_port() -> None:
    env = d.single_process_env({})
    assert (env["RANK"], env["WORLD_SIZE"], env["MASTER_ADDR"]) == ("0", "1", "127.0.0.1")
    assert 0 < int(env["MASTER_PORT"]) < 65536
    assert d.single_process_env({"DLHPC_MASTER_PORT": "29999"})["MASTER_PORT"] == "29999"


def _spec(tmp_path: Path, env: dict[str, str]) -> TrialSpec:
    return make_spec(tmp_path, trial_id=2, env=env)


def test_worker_gives_each_srun_task_its_rank_and_the_config_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in _slurm().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("RANK", "0")  # stale: exported from the submitting shell
    env = _child_env(_spec(tmp_path, {"MASTER_PORT": "29555"}), tmp_path, tmp_path / "a")
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == ("3", "4", "1")
    assert env["LOCAL_WORLD_SIZE"] == "2" and env["MASTER_PORT"] == "29555"
    assert env["MASTER_ADDR"] == socket.gethostbyname("localhost")


def test_worker_outside_slurm_sets_no_rank_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in [*d.RANK_VARS, "SLURM_PROCID"]:
        monkeypatch.delenv(key, raising=False)
    env = _child_env(_spec(tmp_path, {}), tmp_path, tmp_path / "a")
    assert not set(d.RANK_VARS) & set(env)


def test_worker_with_unusable_slurm_variables_warns_and_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for key, value in _slurm(SLURM_JOB_NODELIST="node[").items():
        monkeypatch.setenv(key, value)
    for key in d.RANK_VARS:
        monkeypatch.delenv(key, raising=False)
    env = _child_env(_spec(tmp_path, {}), tmp_path, tmp_path / "a")
    assert "RANK" not in env and "rank variables not set" in capsys.readouterr().err
