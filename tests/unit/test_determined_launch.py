"""The Determined stand-in's container layout and launch layers: the variables each
worker gets (one node, two nodes, the deepspeed layer), the workers run by the real
worker (one per slot, output prefixed by rank, only the chief publishing), a failing
worker stopping the others, usage errors, the Trial API modules refused, and stage 4 of
Determined's Core API tutorial, unchanged, with its own launcher."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dlhpc.errors import DlhpcError
from dlhpc.integrations.determined import ENV_SLOTS
from dlhpc.integrations.determined.cluster import (
    ENV_CONTAINER_RANK,
    container_layout,
    gpu_uuids,
)
from dlhpc.integrations.determined.launch import worker_envs
from dlhpc.protocol import TrialSpec, read_event_batches

TUTORIAL = Path(__file__).resolve().parents[1] / "data" / "determined-core-api-tutorial"
SHIM = [sys.executable, "-m", "dlhpc.integrations.determined"]


def _pick(env: dict[str, str], *names: str) -> list[str]:
    return [env[n] for n in names]


def test_one_container_starts_one_worker_per_slot_on_this_host() -> None:
    envs = worker_envs({ENV_SLOTS: "2", "MASTER_PORT": "20007"}, "torch")
    names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK")
    assert [_pick(e, *names) for e in envs] == [
        ["0", "0", "2", "2", "0"],
        ["1", "1", "2", "2", "0"],
    ]
    for env in envs:
        assert _pick(env, "MASTER_ADDR", "MASTER_PORT", "GROUP_WORLD_SIZE") == [
            "127.0.0.1",
            "20007",
            "1",
        ]
        assert env["USE_TORCH_DISTRIBUTED"] == "True" and env[ENV_CONTAINER_RANK] == "0"
    lone = worker_envs({}, "deepspeed")  # the local backend: one slot, a port free now
    assert len(lone) == 1 and lone[0]["MASTER_PORT"].isdigit() and lone[0]["USE_DEEPSPEED"] == "1"


SLURM_NODE_2 = {
    "SLURM_JOB_ID": "7",
    "SLURM_JOB_NODELIST": "nodea[1-2]",
    "RANK": "1",
    "WORLD_SIZE": "2",
    "LOCAL_RANK": "0",
    "LOCAL_WORLD_SIZE": "1",
    "MASTER_ADDR": "nodea1",
    "MASTER_PORT": "20007",
    ENV_SLOTS: "3",
}


def test_the_second_of_two_nodes_continues_the_ranks_of_the_first() -> None:
    assert container_layout(SLURM_NODE_2) == (1, ["nodea1", "nodea2"])  # names not resolvable
    envs = worker_envs(SLURM_NODE_2, "deepspeed")
    assert [_pick(e, "RANK", "LOCAL_RANK") for e in envs] == [["3", "0"], ["4", "1"], ["5", "2"]]
    for env in envs:
        assert _pick(env, "WORLD_SIZE", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE") == [
            "6",
            "3",
            "1",
            "2",
        ]
        assert _pick(env, "MASTER_ADDR", "DET_CHIEF_IP", "MASTER_PORT") == [
            "nodea1",
            "nodea1",
            "20007",
        ]
        assert env["USE_DEEPSPEED"] == "1" and "USE_TORCH_DISTRIBUTED" not in env
        # what a worker's get_cluster_info() reads: its container's, not its own RANK
        assert container_layout({**SLURM_NODE_2, **env}) == (1, ["nodea1", "nodea2"])


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({ENV_SLOTS: "0"}, "at least one slot"),
        ({"MASTER_PORT": ""}, "MASTER_PORT"),
        ({"WORLD_SIZE": "4"}, "cannot place 4 tasks"),
        ({ENV_SLOTS: "two"}, "non-negative integer"),
    ],
)
def test_a_layout_it_cannot_place_is_an_error(change: dict[str, str], why: str) -> None:
    with pytest.raises(DlhpcError, match=why):
        worker_envs({**SLURM_NODE_2, **change}, "torch")


def _trial(tmp_path: Path, entry: str, slots: int, script: tuple[str, str] | None = None) -> Path:
    exp = tmp_path / "exp"
    code = exp / "code"
    code.mkdir(parents=True)
    if script is not None:
        (code / script[0]).write_text(script[1])
    for f in TUTORIAL.glob("*.py"):
        shutil.copy(f, code / f.name)
    trap = "trap ':' TERM USR2 INT"  # as in every entry.sh dlhpc writes
    (exp / "entry.sh").write_text(
        f"#!/bin/bash\n{trap}\npython -m dlhpc.integrations.determined {entry}\n"
    )
    tdir = exp / "trials" / "trial-000001"
    tdir.mkdir(parents=True)
    TrialSpec(
        experiment_id=1,
        trial_id=1,
        hparams={"increment_by": 3},
        max_length=5,
        seed=5,
        experiment_dir=str(exp),
        code_dir=str(code),
        entry_script=str(exp / "entry.sh"),
        checkpoint_dir=str(tmp_path / "ckpt"),
        metric="x",
        smaller_is_better=True,
        env={ENV_SLOTS: str(slots)},
    ).write(tdir / "trial.json")
    return tdir


def _run_worker(tdir: Path) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "DLHPC_"))}
    env["DLHPC_JOB_ID"] = "local-1"
    proc = subprocess.run(
        [sys.executable, "-m", "dlhpc.harness.worker", str(tdir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    attempt = tdir / "attempts" / "local-1.r0"
    records = [r for b in read_event_batches(attempt) for r in b.records]
    assert sorted({p.name.rsplit("-", 1)[0] for p in attempt.glob("*.jsonl")}) == [
        "user-r0",
        "worker-r0",
    ]  # only the chief of the workers publishes
    return proc, records


TORCH_SCRIPT = """\
import json, os, determined as det
from_ds = det.core.DistributedContext.from_deepspeed()  # the same ranks from DeepSpeed's names
distributed = det.core.DistributedContext.from_torch_distributed()
assert vars(from_ds) == vars(distributed), (vars(from_ds), vars(distributed))
info = det.get_cluster_info()
with det.core.init(distributed=distributed) as core:
    mine = (core.distributed.rank, int(os.environ["LOCAL_RANK"]), info.container_rank)
    everyone = core.distributed.allgather(mine)
    for op in core.searcher.operations():
        if core.distributed.rank == 0:
            core.train.report_validation_metrics(op.length, {"x": float(len(everyone))})
            op.report_completed(float(len(everyone)))
    print("OUT " + json.dumps([everyone, len(info.slot_ids), os.environ["USE_TORCH_DISTRIBUTED"]]))
"""


def test_the_torch_distributed_layer_runs_a_worker_per_slot(tmp_path: Path) -> None:
    entry = "sh -c 'python3 -m determined.launch.torch_distributed python3 td.py'"
    tdir = _trial(tmp_path, entry, 3, ("td.py", TORCH_SCRIPT))
    proc, records = _run_worker(tdir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    outs = sorted(line for line in proc.stdout.splitlines() if " OUT " in line)
    want = [[[0, 0, 0], [1, 1, 0], [2, 2, 0]], 3, "True"]
    assert outs == [f"[rank={r}] OUT {json.dumps(want)}" for r in range(3)]
    assert [(r["step"], r["metrics"]) for r in records if r["type"] == "metric"][-1] == (
        5,
        {"x": 3.0},
    )
    assert [r["reason"] for r in records if r["type"] == "exit"] == ["completed"]


def _launch(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    argv = [*SHIM, sys.executable, "-m", *args]
    full = {**os.environ, ENV_SLOTS: "2", "MASTER_PORT": "20999", **env}
    return subprocess.run(argv, env=full, capture_output=True, text=True, timeout=120)


def test_a_failing_worker_stops_the_others_and_requeue_codes_pass_through() -> None:
    crash = "import os, sys, time; os.environ['RANK'] == '1' and sys.exit(3); time.sleep(60)"
    began = time.monotonic()
    got = _launch(["determined.launch.torch_distributed", sys.executable, "-c", crash], {})
    assert got.returncode == 3 and time.monotonic() - began < 30, got.stderr
    both = "import sys; sys.exit(75)"  # every worker asks for a requeue: so does the layer
    assert _launch(["determined.launch.deepspeed", sys.executable, "-c", both], {}).returncode == 75


def test_wrap_rank_prefixes_each_line_and_keeps_the_exit_code() -> None:
    script = "import sys; print('out'); print('err', file=sys.stderr); sys.exit(4)"
    got = _launch(
        ["determined.launch.wrap_rank", "NOPE,RANK", "--", sys.executable, "-c", script],
        {"RANK": "5"},
    )
    assert (got.returncode, got.stdout, got.stderr) == (4, "[rank=5] out\n", "[rank=5] err\n")


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["determined.launch.torch_distributed", "--trial", "m:T"], "Trial API"),
        (["determined.launch.torch_distributed", "--nnodes", "2", "--", "x"], "overrides"),
        (["determined.launch.deepspeed"], "no script"),
        (["determined.launch.horovod", "x"], "not supported"),
        (["determined.launch.wrap_rank", "0"], "usage"),
    ],
)
def test_what_the_launch_layers_do_not_run_exits_2(args: list[str], why: str) -> None:
    got = _launch(args, {})
    assert got.returncode == 2 and why in got.stderr, got.stderr


def test_determineds_trial_apis_name_the_core_api_route() -> None:
    code = (
        "import determined as det\n"
        "try:\n    det.keras\nexcept AttributeError as e:\n    print('attr', e)\n"
        "import determined.pytorch\n"
    )
    got = subprocess.run([*SHIM, sys.executable, "-c", code], capture_output=True, text=True)
    assert got.returncode == 1 and "attr determined.keras is not supported" in got.stdout
    assert "ImportError: determined.pytorch is not supported" in got.stderr
    assert "det.core.init()" in got.stderr


def test_stage_4_of_the_tutorial_runs_unchanged_with_its_own_launcher(tmp_path: Path) -> None:
    """Its launcher reads slot_ids, container_addrs and container_rank and starts the
    workers through wrap_rank; each passes a DistributedContext to core.init()."""
    tdir = _trial(tmp_path, "sh -c 'python3 4_distributed.py launcher'", 2)
    proc, records = _run_worker(tdir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[rank=0] INFO" in proc.stderr and "[rank=1] INFO" in proc.stderr  # logging
    metrics = [(r["step"], r["metrics"]) for r in records if r["type"] == "metric"]
    assert metrics[-1] == (100, {"x": 600.0})  # 100 batches of both workers' increment_by 3
    assert [r["step"] for r in records if r["type"] == "checkpoint"][-1] == 100


def test_a_preemption_reaches_the_stage_4_launcher_and_its_workers(tmp_path: Path) -> None:
    """TERM (forwarded by the worker to the entrypoint's process group, as Slurm signals
    every process of the step) reaches the tutorial's launcher, which has no handler of
    its own, and its workers: the workers checkpoint and exit for requeue, the launcher
    lives on and exits with their code, so the exit record follows the last checkpoint."""
    tdir = _trial(tmp_path, "sh -c 'python3 4_distributed.py launcher'", 2)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "DLHPC_"))}
    env["DLHPC_JOB_ID"] = "local-1"
    argv = [sys.executable, "-m", "dlhpc.harness.worker", str(tdir)]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    attempt = tdir / "attempts" / "local-1.r0"
    deadline = time.monotonic() + 120
    while not list(attempt.glob("user-r0-*.jsonl")):  # the first metrics: training is on
        assert time.monotonic() < deadline and proc.poll() is None, "training never started"
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 75, out.decode()
    records = [r for b in read_event_batches(attempt) for r in b.records]
    (exit_rec,) = [r for r in records if r["type"] == "exit"]
    assert (exit_rec["reason"], exit_rec["signal"]) == ("requeue", "TERM")
    saved = [r for r in records if r["type"] == "checkpoint"]
    assert saved and exit_rec["checkpoint_step"] == saved[-1]["step"], records
    assert exit_rec["time"] > saved[-1]["time"]


SELF_TERM = """\
import os, signal, subprocess, sys, determined as det
det.get_cluster_info()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) if CHILD else None
os.kill(os.getpid(), signal.SIGTERM)
print("alive", flush=True)
if child:
    child.kill()
"""


@pytest.mark.parametrize("child", [True, False], ids=["launcher", "no-children"])
def test_after_get_cluster_info_only_a_launcher_lives_on_at_term(
    tmp_path: Path, child: bool
) -> None:
    """A process with children (a launcher) survives TERM; one without (a script that
    has not entered core.init()) still ends of it."""
    tdir = _trial(tmp_path, "true", 1)
    env = {**os.environ, "DLHPC_TRIAL_DIR": str(tdir)}
    code = SELF_TERM.replace("CHILD", str(child))
    got = subprocess.run(
        [*SHIM, sys.executable, "-c", code],
        env=env,
        capture_output=True,
        preexec_fn=_default_term,  # as a job's process starts, whatever this one inherited
    )
    assert (got.returncode, got.stdout) == ((0, b"alive\n") if child else (-15, b"")), got


def _default_term() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def test_sh_c_runs_one_simple_command_in_its_place_and_the_rest_through_sh(
    tmp_path: Path,
) -> None:
    """Like bash -c, so that the script, not a dash in between, gets preemption's TERM."""
    (tmp_path / "pid.py").write_text("import os\nprint(os.getpid())\n")
    one = subprocess.Popen(
        [*SHIM, "sh", "-c", "python3 'pid.py'"], cwd=tmp_path, stdout=subprocess.PIPE, text=True
    )
    out, _ = one.communicate(timeout=60)
    assert out.strip() == str(one.pid)  # exec'd all the way: the same process
    both = subprocess.run(
        [*SHIM, "sh", "-c", "echo $((1 + 1)) && FOO=x sh -c 'echo $FOO'"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert both.stdout == "2\nx\n", both.stderr


class _FakeNvml:
    """Two GPUs, as NVML names them (bytes UUIDs, as older pynvml returns)."""

    class NVMLError(Exception):
        pass

    uuids = (b"GPU-aaaa", b"GPU-bbbb")

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802 (NVML's names)
        return len(self.uuids)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:  # noqa: N802
        if i >= len(self.uuids):
            raise self.NVMLError("Invalid Argument")
        return i

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:  # noqa: N802
        return [u.decode() for u in self.uuids].index(uuid)

    def nvmlDeviceGetUUID(self, handle: int) -> bytes:  # noqa: N802
        return self.uuids[handle]


def test_gpu_uuids_are_the_visible_gpus_and_none_on_a_cpu_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dlhpc.integrations.determined import cluster

    monkeypatch.setattr(cluster, "load_nvml", lambda: (None, "ModuleNotFoundError: pynvml"))
    assert gpu_uuids({}) == [] and gpu_uuids({"CUDA_VISIBLE_DEVICES": ""}) == []  # CPU
    given = {"CUDA_VISIBLE_DEVICES": "GPU-x, MIG-y"}
    assert gpu_uuids(given) == ["GPU-x", "MIG-y"]  # UUIDs need no NVML
    with pytest.raises(DlhpcError, match=r"CUDA_VISIBLE_DEVICES='1' needs NVML \(Module"):
        gpu_uuids({"CUDA_VISIBLE_DEVICES": "1"})
    monkeypatch.setattr(cluster, "load_nvml", lambda: (_FakeNvml(), ""))
    assert gpu_uuids({}) == ["GPU-aaaa", "GPU-bbbb"]  # every GPU NVML shows
    assert gpu_uuids({"CUDA_VISIBLE_DEVICES": "1,GPU-aaaa"}) == ["GPU-bbbb", "GPU-aaaa"]
    with pytest.raises(DlhpcError, match="NVML: Invalid Argument"):
        gpu_uuids({"CUDA_VISIBLE_DEVICES": "7"})


def test_cluster_info_has_gpu_uuids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dlhpc.integrations.determined import cluster

    tdir = _trial(tmp_path, "true", 1)
    spec = TrialSpec.read(tdir / "trial.json")
    monkeypatch.setattr(cluster, "load_nvml", lambda: (_FakeNvml(), ""))
    info = cluster.ClusterInfo(spec, {"CUDA_VISIBLE_DEVICES": "1"})
    assert info.gpu_uuids == ["GPU-bbbb"]
