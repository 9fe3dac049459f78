"""The Determined Core API stand-in: a tutorial-style script run by the real worker
in a fake trial folder (metrics in event files, checkpoints published and restored,
preemption), and an installed ``determined`` never shadowed outside such jobs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dlhpc.protocol import TrialSpec, read_event_batches
from dlhpc.protocol.checkpoint import latest_verified, list_checkpoints

EXAMPLE = Path(__file__).resolve().parents[2] / "templates" / "examples" / "determined-core"
HPARAMS = {
    "lr": 0.05,
    "hidden": 8,
    "batch_size": 16,
    "data_seed": 3,
    "checkpoint_every": 5,
    "step_sleep": 0.0,
}
ENTRY = (
    "#!/bin/bash\ntrap ':' TERM USR2 INT\n"
    "python -m dlhpc.integrations.determined python3 train.py\n"
)


def _trial(tmp_path: Path, max_length: int, hparams: dict[str, Any], env: dict[str, str]) -> Path:
    exp = tmp_path / "exp"
    (exp / "code").mkdir(parents=True, exist_ok=True)
    (exp / "code" / "train.py").write_bytes((EXAMPLE / "train.py").read_bytes())
    (exp / "entry.sh").write_text(ENTRY)
    tdir = exp / "trials" / "trial-000001"
    tdir.mkdir(parents=True, exist_ok=True)
    TrialSpec(
        experiment_id=1,
        trial_id=1,
        hparams=hparams,
        max_length=max_length,
        seed=5,
        experiment_dir=str(exp),
        code_dir=str(exp / "code"),
        entry_script=str(exp / "entry.sh"),
        checkpoint_dir=str(tmp_path / "ckpt"),
        metric="val_loss",
        smaller_is_better=True,
        env=env,
    ).write(tdir / "trial.json")
    return tdir


def _env(job: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "DLHPC_"))}
    env["DLHPC_JOB_ID"] = job
    return env


def _worker(tdir: Path, job: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "dlhpc.harness.worker", str(tdir)],
        env=_env(job),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _records(tdir: Path, job: str) -> list[dict[str, Any]]:
    batches = read_event_batches(tdir / "attempts" / f"{job}.r0")
    return [r for b in batches for r in b.records]


def _weights(ckpt_dir: Path) -> dict[str, Any]:
    import torch

    ckpt, _ = latest_verified(ckpt_dir)
    assert ckpt is not None
    return dict(torch.load(ckpt.path / "state.pt", weights_only=True))


def test_a_core_api_script_reports_checkpoints_and_resumes_after_term(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")

    # the reference: one uninterrupted run of 60 batches
    ref_dir = tmp_path / "ref"
    ref = _worker(_trial(ref_dir, 60, HPARAMS, {}), "local-ref_0")
    out, _ = ref.communicate(timeout=120)
    assert ref.returncode == 0, out
    want = _weights(ref_dir / "ckpt")

    slow = {**HPARAMS, "step_sleep": 0.05}
    tdir = _trial(tmp_path, 60, slow, {})
    first = _worker(tdir, "local-a_0")
    deadline = time.monotonic() + 60
    while not list_checkpoints(tmp_path / "ckpt"):  # trains and checkpoints, then TERM
        assert time.monotonic() < deadline and first.poll() is None, first.communicate()[0]
        time.sleep(0.05)
    first.send_signal(signal.SIGTERM)
    out, _ = first.communicate(timeout=60)
    assert first.returncode == 75, out  # exit for requeue, not "completed"
    records = _records(tdir, "local-a_0")
    ckpts = [r for r in records if r["type"] == "checkpoint"]
    assert ckpts and ckpts[-1]["step"] < 60, records
    metrics = [r for r in records if r["type"] == "metric"]
    assert metrics and all(set(r["metrics"]) == {"train_loss"} for r in metrics)
    assert records[-1]["type"] == "exit" and records[-1]["reason"] == "requeue"
    stopped_at = ckpts[-1]["step"]

    second = _worker(tdir, "local-b_0")  # the requeued job: resumes from latest_checkpoint
    out, _ = second.communicate(timeout=120)
    assert second.returncode == 0, out
    assert f"resumed at batch {stopped_at}" in out
    records = _records(tdir, "local-b_0")
    val = [r for r in records if r["type"] == "metric" and "val_loss" in r["metrics"]]
    assert [r["step"] for r in val] == [60, 60]  # validation report + op.report_completed
    final = [r for r in records if r["type"] == "checkpoint"][-1]
    assert final["step"] == 60 and final["metric"] == val[-1]["metrics"]["val_loss"]
    got = _weights(tmp_path / "ckpt")
    assert got["batches"] == want["batches"] == 60
    for name, tensor in want["model"].items():
        assert torch.equal(tensor, got["model"][name]), name  # bitwise as uninterrupted


def test_the_operation_length_is_the_grant_and_metadata_round_trips(tmp_path: Path) -> None:
    script = (
        "import json, determined as det\n"
        "info = det.get_cluster_info()\n"
        "with det.core.init() as core:\n"
        "    ops = [op.length for op in []]\n"
        "    for op in core.searcher.operations():\n"
        "        ops.append(op.length)\n"
        "        with core.checkpoint.store_path({'steps_completed': op.length, 'k': 'v'})"
        " as (p, sid):\n"
        "            (p / 'w.txt').write_text('x')\n"
        "        core.train.report_validation_metrics(steps_completed=1,"
        " metrics={'acc': 0.5, 'batches': op.length, 'note': 'text'})\n"
        "        op.report_completed(0.25)\n"
        "    print(json.dumps({'ops': ops, 'hp': info.trial.hparams, 'data': info.user_data,"
        " 'meta': core.checkpoint.get_metadata(sid), 'rank': core.distributed.rank,"
        " 'size': core.distributed.size, 'units': str(core.searcher.get_configured_units()),"
        " 'shim': det.DLHPC_SHIM}))\n"
    )
    env = {
        "DLHPC_DETERMINED_TIME_METRIC": "batches",
        "DLHPC_DETERMINED_UNIT": "batches",
        "DLHPC_DETERMINED_USER_DATA": json.dumps({"url": "x"}),
    }
    tdir = _trial(tmp_path, 7, {"a": 1}, env)
    (tdir.parents[1] / "code" / "train.py").write_text(script)
    proc = _worker(tdir, "local-c_0")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    line = next(x for x in out.splitlines() if x.startswith("{"))
    assert json.loads(line) == {
        "ops": [7],
        "hp": {"a": 1},
        "data": {"url": "x"},
        "meta": {"steps_completed": 7, "k": "v"},
        "rank": 0,
        "size": 1,
        "units": "Unit.BATCHES",
        "shim": True,
    }
    metrics = [r for r in _records(tdir, "local-c_0") if r["type"] == "metric"]
    # the time metric places the validation report; text values are not metrics
    assert [(r["step"], r["metrics"]) for r in metrics] == [
        (7, {"acc": 0.5, "batches": 7.0}),
        (7, {"val_loss": 0.25}),
    ]


def _import_determined(env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    code = "import determined; print(getattr(determined, 'DLHPC_SHIM', False))"
    return subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True, check=False
    )


def test_outside_a_launcher_job_determined_is_never_the_stand_in(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path.cwd())])
    plain = _import_determined(env, tmp_path)
    assert "True" not in plain.stdout  # not installed here (ModuleNotFoundError) or the real one
    fake = tmp_path / "site" / "determined"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("REAL = True\n")
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "site"), str(Path.cwd())])
    installed = _import_determined(env, tmp_path)  # an "installed" determined wins: not shadowed
    assert installed.returncode == 0 and installed.stdout.strip() == "False", installed.stderr
    import dlhpc.integrations.determined  # noqa: F401  (importing dlhpc's adapter changes nothing)

    assert "determined" not in sys.modules


def test_the_stand_in_refuses_outside_a_dlhpc_job(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLHPC_")}
    code = "import determined as det\nassert det.get_cluster_info() is None\ndet.core.init()\n"
    proc = subprocess.run(
        [sys.executable, "-m", "dlhpc.integrations.determined", sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1 and "runs only inside dlhpc jobs" in proc.stderr, proc.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "dlhpc.integrations.determined"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "usage" in bad.stderr


@pytest.mark.parametrize("missing", ["no-such-program-xyz"])
def test_the_launcher_names_a_command_it_cannot_run(missing: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "dlhpc.integrations.determined", missing],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2 and missing in proc.stderr


def test_the_example_script_is_its_own_plain_version() -> None:
    """The Determined script runs under dlhpc with zero added lines: no line of it
    names dlhpc (the README's "lines you add" count for determined-core is 0)."""
    text = (EXAMPLE / "train.py").read_text()
    assert (EXAMPLE / "train_plain.py").read_text() == text  # byte for byte
    assert "import determined as det" in text
    assert [line for line in text.splitlines() if "dlhpc" in line.lower()] == []


DISTRIBUTED = """\
import json, time, torch.distributed as dist, determined as det
dist.init_process_group("gloo")
distributed = det.core.DistributedContext.from_torch_distributed()
info = det.get_cluster_info()
with det.core.init(distributed=distributed) as core:
    ranks = core.distributed.allgather(core.distributed.rank)
    chief = core.distributed.broadcast("from-chief" if core.distributed.rank == 0 else None)
    for op in core.searcher.operations():
        if core.distributed.rank == 0:
            with core.checkpoint.store_path({"steps_completed": op.length}) as (path, _):
                (path / "w").write_text("x")
            op.report_completed(1.5)
        else:
            try:
                with core.checkpoint.store_path({"steps_completed": 1}):
                    pass
                refused = False
            except RuntimeError:
                refused = True
        polls = 0
        while not core.preempt.should_preempt() and polls < 100:  # the stop file: every 2 s
            polls += 1
            time.sleep(0.1)
        stop = core.preempt.should_preempt()
    out = {"ranks": ranks, "chief": chief, "stop": stop, "size": core.distributed.size}
    if core.distributed.rank:
        out["refused"] = refused
    print("OUT " + json.dumps(out), flush=True)
    dist.destroy_process_group()
"""


def test_two_ranks_share_collectives_and_the_chiefs_stop_decision(tmp_path: Path) -> None:
    import socket

    pytest.importorskip("torch")  # the ranks' script: torch.distributed

    tdir = _trial(tmp_path, 4, {}, {})
    code = tdir.parents[1] / "code"
    (code / "train.py").write_text(DISTRIBUTED)
    (tdir / "stop.json").write_text("{}")  # the searcher stopped the trial: both ranks agree
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in (0, 1):
        env = _env("unused")
        env.update(
            DLHPC_TRIAL_DIR=str(tdir),
            DLHPC_ATTEMPT_DIR=str(tdir / "attempts" / "local-d_0.r0"),
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE="2",
            LOCAL_WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        cmd = [sys.executable, "-m", "dlhpc.integrations.determined", sys.executable, "train.py"]
        procs.append(
            subprocess.Popen(
                cmd, cwd=code, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    outs = [p.communicate(timeout=120)[0] for p in procs]
    for p, out in zip(procs, outs, strict=True):
        assert p.returncode == 75, out  # both stopped: exit for requeue / stop
    got = [json.loads(next(x for x in o.splitlines() if x.startswith("OUT "))[4:]) for o in outs]
    assert got[0] == {"ranks": [0, 1], "chief": "from-chief", "stop": True, "size": 2}
    assert got[1] == {**got[0], "refused": True}
    records = _records(tdir, "local-d_0")
    assert [r["step"] for r in records if r["type"] == "checkpoint"] == [4]  # the chief's only


UPLOAD = """\
import json, pathlib, determined as det
det.get_cluster_info()
out = {}
with det.core.init() as core:
    src = pathlib.Path("src")
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "w.bin").write_bytes(b"weights")
    first = core.checkpoint.upload(src, {"steps_completed": 3, "note": "up"})
    core.checkpoint.download(first, "copy")
    out["copied"] = pathlib.Path("copy/sub/w.bin").read_bytes().decode()
    out["meta"] = core.checkpoint.get_metadata(first)
    with core.checkpoint.restore_path(first) as path:
        (path / "sub" / "w.bin").write_bytes(b"WEIGHTS")  # corrupt it: same size
    try:
        with core.checkpoint.restore_path(first):
            pass
    except RuntimeError as err:
        out["torn"] = "sha256" in str(err)
    try:
        core.checkpoint.delete(first)
    except NotImplementedError:
        out["delete"] = "refused"
    try:
        with core.checkpoint.store_path({"steps_completed": 4}) as (path, sid):
            raise ValueError("save failed")
    except ValueError:
        pass
    print("OUT " + json.dumps(out), flush=True)
"""


def test_upload_download_metadata_and_a_corrupt_checkpoint_is_never_restored(
    tmp_path: Path,
) -> None:
    tdir = _trial(tmp_path, 1, {}, {})
    (tdir.parents[1] / "code" / "train.py").write_text(UPLOAD)
    proc = _worker(tdir, "local-u_0")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    got = json.loads(next(x for x in out.splitlines() if x.startswith("OUT "))[4:])
    assert got == {
        "copied": "weights",
        "meta": {"steps_completed": 3, "note": "up"},
        "torn": True,
        "delete": "refused",
    }
    ckpts = [r for r in _records(tdir, "local-u_0") if r["type"] == "checkpoint"]
    assert [r["step"] for r in ckpts] == [3]  # the failed save published nothing
    root = tmp_path / "ckpt"
    assert sorted(p.name for p in root.iterdir()) == ["ckpt-0000000003"]  # no temp left
