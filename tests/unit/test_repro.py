"""dlhpc.repro: the launch record (git and non-git code), the attempt record
(redaction, NVML, data fingerprints), the diff, and the ``data:`` config key."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dlhpc.config import DataInput, ExperimentConfig
from dlhpc.config.serde import from_jsonable, to_jsonable
from dlhpc.errors import ConfigError
from dlhpc.protocol import TrialSpec
from dlhpc.repro import (
    REDACTED,
    _launch,
    attempt_record,
    code_files,
    code_record,
    collect_launch_record,
    diff_records,
    fingerprint_data,
    merge_env_record,
    redacted_env,
    trial_record,
)
from dlhpc.scheduler.slurm.environment import SlurmJobEnvironment
from tests._config import load_experiment
from tests.unit.test_code_snapshot import ignore_tree

GIT = [
    "git",
    "-c",
    "user.name=t",
    "-c",
    "user.email=t@example.org",
    "-c",
    "init.defaultBranch=main",
]


def _git(cwd: Path, *args: str) -> str:
    out = subprocess.run([*GIT, *args], cwd=cwd, check=True, capture_output=True, text=True)
    return out.stdout.strip()


def test_git_workdir_records_commit_branch_remote_diff_and_untracked(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    work = repo / "exp"
    work.mkdir(parents=True)
    _git(repo, "init", "-q")
    (work / "train.py").write_text("print('v1')\n")
    (repo / ".gitignore").write_text("*.log\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "one")
    _git(repo, "remote", "add", "origin", "https://alice:s3cret@git.example.org/lab/x.git")
    (work / "train.py").write_text("print('v2')\n")  # dirty
    (work / "new.py").write_text("x = 1\n")  # untracked: in the snapshot, not in the diff
    (work / "out.log").write_text("ignored\n")
    (work / "__pycache__").mkdir()
    (work / "__pycache__" / "t.pyc").write_bytes(b"\0")

    rec = code_record(work)
    assert rec["kind"] == "git" and rec["root"] == str(repo) and rec["subdir"] == "exp"
    assert rec["commit"] == _git(repo, "rev-parse", "HEAD") and rec["branch"] == "main"
    assert rec["remote"] == "https://<redacted>@git.example.org/lab/x.git"
    assert rec["dirty"] is True and any("train.py" in s for s in rec["status"])
    diff = subprocess.run(
        ["git", "diff", "HEAD", "--binary", "--", "."], cwd=work, capture_output=True, check=True
    ).stdout
    assert "+print('v2')" in rec["diff"] and not rec["diff_truncated"]
    assert rec["diff_sha256"] == hashlib.sha256(diff).hexdigest()
    assert rec["untracked"] == [
        {"path": "new.py", "sha256": hashlib.sha256(b"x = 1\n").hexdigest()}
    ]
    # the digest changes with the code, and only with it
    assert code_record(work)["digest"] == rec["digest"]
    (work / "new.py").write_text("x = 2\n")
    assert code_record(work)["digest"] != rec["digest"]


def test_non_git_workdir_gets_a_manifest_honouring_gitignore_as_git_does(tmp_path: Path) -> None:
    work = tmp_path / "work"
    kept = ignore_tree(work)
    expected = {rel: hashlib.sha256(text.encode()).hexdigest() for rel, text in kept.items()}

    rec = code_record(work)
    assert rec["kind"] == "snapshot" and rec["ignore_rules"].startswith("pathspec")
    assert rec["manifest"] == expected and rec["files"] == len(expected)
    assert code_files(work) == (sorted(expected), rec["ignore_rules"])
    # git's own answer for the same tree: the same files
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    in_git, rules = code_files(work)
    assert rules.startswith("git ls-files") and in_git == sorted(expected)
    subprocess.run(["git", "-C", str(work), "add", "-A"], check=True)  # tracked: the same list
    assert code_files(work)[0] == sorted(expected)
    # past the size limit: a clear message, nothing hashed
    shutil.rmtree(work / ".git")
    big = code_record(work, limit=10)
    assert "manifest" not in big and big["digest"] is None
    assert "past the limit of the code record" in big["error"] and "MiB" in big["error"]


def test_launch_record_parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "t.py").write_text("pass\n")
    (tmp_path / "d.csv").write_text("1,2\n")
    yaml = tmp_path / "exp.yaml"
    yaml.write_text("name: t\nentrypoint: python t.py\ndata: [d.csv]\n")
    cfg = load_experiment(yaml, site="local")
    env = {"LOADEDMODULES": "cuda/12.1:gcc/12", "_LMFILES_": "/m/cuda/12.1:/m/gcc/12"}
    rec = collect_launch_record(cfg, environ=env)
    assert rec["version"] == 1 and rec["code"]["kind"] == "snapshot"
    assert set(rec["code"]["manifest"]) == {"t.py", "d.csv", "exp.yaml"}
    assert rec["packages"]["source"] == "pip freeze" and "pytest" in rec["packages"]["items"]
    assert rec["modules"]["loaded"] == ["cuda/12.1", "gcc/12"]
    assert rec["python"]["version"] == ".".join(map(str, sys.version_info[:3]))
    assert rec["slurm"] is None and rec["site"]["backend"] == "local" and rec["conda"] is None
    assert rec["data"] == [{"path": str(tmp_path / "d.csv"), "hash": False}]
    assert rec["config"]["yaml_sha256"] == hashlib.sha256(yaml.read_bytes()).hexdigest()
    json.dumps(rec)  # JSON-able

    def no_pip(*args: Any, **kwargs: Any) -> Any:
        raise OSError("no pip here")

    monkeypatch.setattr(_launch.subprocess, "Popen", no_pip)
    again = collect_launch_record(cfg, environ=env)  # this process's pip freeze is reused
    assert again["packages"] == rec["packages"]
    _launch._FREEZE_CACHE.clear()
    conda = tmp_path / "conda"
    (conda / "conda-meta").mkdir(parents=True)
    (conda / "conda-meta" / "numpy.json").write_text(
        '{"name": "numpy", "version": "1.26", "build": "py0"}'
    )
    rec = collect_launch_record(cfg, environ={"CONDA_PREFIX": str(conda)})
    assert rec["packages"]["source"] == "importlib.metadata" and "no pip" in rec["packages"]["why"]
    assert "pytest" in rec["packages"]["items"]
    assert rec["conda"]["items"] == {"numpy": "1.26=py0"}


def test_pip_freeze_lines_parse() -> None:
    text = (
        "numpy==1.26.4\n-e git+https://x/y.git@abc#egg=mylib\ntorch @ file:///w/torch.whl\n"
        "# Editable install with no version control (dlhpc==0.1.0)\n-e /work/main\n"
    )
    assert _launch.parse_requirements(text) == {
        "dlhpc": "0.1.0 (-e /work/main)",
        "mylib": "-e git+https://x/y.git@abc#egg=mylib",
        "numpy": "1.26.4",
        "torch": "file:///w/torch.whl",
    }


def test_env_allowlist_and_redaction() -> None:
    env = {
        "CUDA_VISIBLE_DEVICES": "0,1",
        "NCCL_SOCKET_IFNAME": "ib0",
        "OMP_NUM_THREADS": "4",
        "SLURM_JOB_ID": "12",
        "HF_TOKEN": "hf_abc",
        "NCCL_IB_KEY": "k",
        "WANDB_API_KEY": "w",
        "MY_PASSWORD": "p",
        "DB_CREDENTIALS": "c",
        "HOME": "/home/a",
        "PATH": "/bin",
        "GITHUB_TOKEN": "g",
    }
    got = redacted_env(
        env,
        declared=["WANDB_API_KEY", "MY_PASSWORD", "DB_CREDENTIALS"],
        scheduler_vars=SlurmJobEnvironment.record_vars,
    )
    assert got == {
        "CUDA_VISIBLE_DEVICES": "0,1",
        "NCCL_SOCKET_IFNAME": "ib0",
        "OMP_NUM_THREADS": "4",
        "SLURM_JOB_ID": "12",
        "HF_TOKEN": REDACTED,
        "NCCL_IB_KEY": REDACTED,
        "WANDB_API_KEY": REDACTED,
        "MY_PASSWORD": REDACTED,
        "DB_CREDENTIALS": REDACTED,
    }
    assert not any(v in json.dumps(got) for v in ("hf_abc", '"w"', '"p"', '"c"'))


class _FakeNvml:
    shut = False

    def nvmlSystemGetDriverVersion(self) -> bytes:
        return b"550.54.15"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12040

    def nvmlSystemGetNVMLVersion(self) -> str:
        return "12.550.54.15"

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetHandleByUUID(self, u: str) -> int:
        return 1

    def nvmlDeviceGetName(self, h: int) -> str:
        return "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-{h}"

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return SimpleNamespace(total=80 * 2**30)

    def nvmlShutdown(self) -> None:
        _FakeNvml.shut = True


def test_attempt_record_reads_nvml_cpu_env_and_data(tmp_path: Path) -> None:
    (tmp_path / "d.bin").write_bytes(b"abc")
    env = {"CUDA_VISIBLE_DEVICES": "1", "SLURM_JOB_NODELIST": "n[1-2]", "API_TOKEN": "t"}
    rec = attempt_record(
        env,
        rank=0,
        data=[{"path": str(tmp_path / "d.bin"), "hash": True}],
        declared=["API_TOKEN"],
        nodes=SlurmJobEnvironment(env).node_list,
        scheduler_vars=SlurmJobEnvironment.record_vars,
        nvml_loader=lambda: (_FakeNvml(), ""),
    )
    assert rec["nodes"] == "n[1-2]" and rec["cpu"]["model"] and rec["cpu"]["logical_cpus"]
    gpu = rec["gpu"]
    assert (gpu["driver"], gpu["cuda_driver"]) == ("550.54.15", "12.4") and _FakeNvml.shut
    assert gpu["devices"] == [
        {"index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-1", "memory_total": 80 * 2**30}
    ]
    assert rec["env"] == {
        "CUDA_VISIBLE_DEVICES": "1",
        "SLURM_JOB_NODELIST": "n[1-2]",
        "API_TOKEN": REDACTED,
    }
    assert rec["data"][0]["content_sha256"]
    no_gpu = attempt_record({}, nvml_loader=lambda: (None, "ImportError: no pynvml"))
    assert no_gpu["gpu"] == {"devices": [], "unavailable": "ImportError: no pynvml"}
    assert no_gpu["data"] == []

    def broken() -> tuple[Any, str]:
        raise RuntimeError("boom")

    assert "boom" in attempt_record({}, nvml_loader=broken)["gpu"]["error"]  # never raises


def test_data_fingerprint_with_and_without_content_hash(tmp_path: Path) -> None:
    d = tmp_path / "ds"
    (d / "sub").mkdir(parents=True)
    (d / "a.txt").write_text("aaa")
    (d / "sub" / "b.txt").write_text("bb")
    inputs = [{"path": str(d), "hash": False}, {"path": str(d), "hash": True}]
    plain, hashed = fingerprint_data(inputs)
    assert plain["exists"] and plain["kind"] == "dir" and (plain["files"], plain["bytes"]) == (2, 5)
    assert [row[:2] for row in plain["listing"]] == [["a.txt", 3], ["sub/b.txt", 2]]
    assert "content_sha256" not in plain and not plain["listing_truncated"]
    assert hashed["listing"][0][3] == hashlib.sha256(b"aaa").hexdigest()
    # a touch changes the listing, not the content; an edit changes both
    os.utime(d / "a.txt", ns=(1, 1))
    plain2, hashed2 = fingerprint_data(inputs)
    assert plain2["listing_sha256"] != plain["listing_sha256"]
    assert hashed2["content_sha256"] == hashed["content_sha256"]
    (d / "a.txt").write_text("aab")
    assert fingerprint_data(inputs)[1]["content_sha256"] != hashed["content_sha256"]
    one, missing = fingerprint_data(
        [{"path": str(d / "a.txt")}, {"path": str(tmp_path / "nope")}], listing_limit=0
    )
    assert one["kind"] == "file" and one["files"] == 1 and one["listing_truncated"]
    assert missing == {"path": str(tmp_path / "nope"), "hash": False, "exists": False}


def _record(**changes: Any) -> dict[str, Any]:
    experiment = {
        "code": {"kind": "git", "commit": "abc", "diff_sha256": "d0", "digest": "x"},
        "python": {"version": "3.11.7"},
        "packages": {"source": "pip freeze", "items": {"numpy": "1.26.4", "torch": "2.3.0"}},
        "modules": {"loaded": ["cuda/12.1"]},
        "slurm": {"version": "slurm 23.02.7"},
        "site": {"name": "uni"},
    }
    attempt = {
        "nodes": "n1",
        "cpu": {"model": "EPYC"},
        "gpu": {"driver": "550", "cuda_driver": "12.4", "devices": [{"name": "A100"}]},
        "env": {"OMP_NUM_THREADS": "4", "SLURM_JOB_ID": "1"},
        "data": [{"path": "/d", "exists": True, "files": 1, "listing_sha256": "l1",
                  "content_sha256": "c1", "listing": [["x", 1, 5.0]]}],
    }  # fmt: skip
    config = {"entrypoint": "python t.py", "resources": {"mem": "4G"}, "searcher": {"name": "grid"}}
    rec = trial_record(experiment, config, {"lr": 0.1}, 7, 3, attempt)
    for path, value in changes.items():
        *parents, last = path.split("__")
        node = rec
        for p in parents:
            node = node[p]
        node[last] = value
    return rec


def test_diff_of_two_records() -> None:
    a = _record()
    assert diff_records(a, _record()) == []
    b = _record(
        experiment__packages={"items": {"numpy": "2.0.0", "scipy": "1.13"}},
        experiment__modules={"loaded": ["cuda/12.4"]},
        experiment__code={"kind": "git", "commit": "abd", "diff_sha256": "d0", "digest": "y"},
        attempt__gpu={"driver": "555", "cuda_driver": "12.4", "devices": [{"name": "H100"}]},
        attempt__env={"OMP_NUM_THREADS": "8", "SLURM_JOB_ID": "2"},
        attempt__data=[{"path": "/d", "exists": True, "files": 1, "listing_sha256": "l2",
                        "content_sha256": "c1", "listing": [["x", 1, 6.0]]}],
        trial__seed=8,
        trial__hparams={"lr": 0.2},
        config__resources={"mem": "8G"},
        config__searcher={"name": "single"},  # search settings are not compared
    )  # fmt: skip
    volatile = SlurmJobEnvironment.volatile_vars  # the backend's job ids are not compared
    got = {(d.section, d.item): (d.a, d.b) for d in diff_records(a, b, volatile=volatile)}
    assert got == {
        ("code", "commit"): ("abc", "abd"),
        ("code", "digest"): ("x", "y"),
        ("config", "resources.mem"): ("4G", "8G"),
        ("hparams", "lr"): (0.1, 0.2),
        ("seed", "seed"): (7, 8),
        ("packages", "numpy"): ("1.26.4", "2.0.0"),
        ("packages", "scipy"): (None, "1.13"),
        ("packages", "torch"): ("2.3.0", None),
        ("modules", "cuda"): ("cuda/12.1", "cuda/12.4"),
        ("gpu", "driver"): ("550", "555"),
        ("gpu", "devices"): ("A100", "H100"),
        ("env", "OMP_NUM_THREADS"): ("4", "8"),  # job ids differ always: not shown
        ("data", "/d: listing_sha256"): ("l1", "l2"),
        ("data", "/d: x"): ([1, 5.0], [1, 6.0]),
    }
    only = diff_records(a, b, sections={"packages"})
    assert {d.section for d in only} == {"packages"}
    assert "numpy: 1.26.4 -> 2.0.0" in only[0].render()
    # a record without an attempt: one difference, its sections skipped
    c = _record(attempt={})
    assert [(d.section, d.item) for d in diff_records(a, c)] == [("record", "attempt")]


def test_merge_env_record_keeps_rank0_on_top_and_every_node() -> None:
    r1 = {"host": "n2", "rank": 2, "cpu": {"model": "c"}, "gpu": {"driver": "1"}, "data": []}
    r0 = {"host": "n1", "rank": 0, "cpu": {"model": "c"}, "gpu": {"driver": "1"}, "data": [1]}
    merged = json.loads(
        merge_env_record(
            merge_env_record("{}", {"rank": 2, "record": r1}), {"rank": 0, "record": r0}
        )
    )
    assert merged["host"] == "n1" and merged["data"] == [1] and set(merged["hosts"]) == {"n1", "n2"}
    again = json.loads(merge_env_record(json.dumps(merged), {"rank": 2, "record": r1}))
    assert again["host"] == "n1" and set(again["hosts"]) == {"n1", "n2"}
    assert merge_env_record("not json", {"rank": 0}) == "{}"


# --- config: data --------------------------------------------------------------------


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    (tmp_path / "home").mkdir()
    monkeypatch.chdir(tmp_path)
    return {"HOME": str(tmp_path / "home"), "PATH": str(tmp_path / "bin"), "D": str(tmp_path)}


def test_data_key_resolves_paths(tmp_path: Path, env: dict[str, str]) -> None:
    (tmp_path / "ds").mkdir()
    (tmp_path / "f.csv").write_text("x")
    Path("exp.yaml").write_text(
        "name: t\nentrypoint: python t.py\ndata:\n  - ds\n  - {path: '${D}/f.csv', hash: true}\n"
    )
    cfg = load_experiment("exp.yaml", environ=env)
    assert cfg.data == (DataInput(tmp_path / "ds"), DataInput(tmp_path / "f.csv", hash=True))
    assert from_jsonable(ExperimentConfig, json.loads(json.dumps(to_jsonable(cfg)))) == cfg
    spec = json.loads(json.dumps(to_jsonable(cfg)))
    del spec["data"]  # a config stored before `data:` existed still loads
    assert from_jsonable(ExperimentConfig, spec).data == ()
    assert TrialSpec(**{**_spec_fields(), "data": [{"path": "/x", "hash": True}]}).data


def _spec_fields() -> dict[str, Any]:
    return dict(
        experiment_id=1, trial_id=1, hparams={}, max_length=1, seed=0, experiment_dir="/e",
        code_dir="/e/code", entry_script="/e/entry.sh", checkpoint_dir="/c", metric="m",
        smaller_is_better=True,
    )  # fmt: skip


def test_data_key_errors_have_lines(tmp_path: Path, env: dict[str, str]) -> None:
    (tmp_path / "ds").mkdir()
    Path("exp.yaml").write_text(
        "name: t\n"
        "entrypoint: python t.py\n"
        "data:\n"
        "  - ds\n"  # 4: fine
        "  - 3\n"  # 5
        "  - {path: ds}\n"  # 6: duplicate
        "  - {path: nope, hash: true}\n"  # 7: missing
        "  - {hash: yes please}\n"  # 8: no path, bad hash
        "  - {path: ds, hsh: true}\n"  # 9: unknown key
        "  - '${UNDEFINED}/x'\n"  # 10
    )
    with pytest.raises(ConfigError) as info:
        load_experiment("exp.yaml", environ=env)
    lines = str(info.value).splitlines()
    assert (
        lines[0] == "exp.yaml:5: data[1]: must be a path or a mapping {path: P, hash: true}, got 3"
    )
    assert (
        lines[1].startswith("exp.yaml:6: data[2].path: ")
        and "already declared at data[0]" in lines[1]
    )
    assert lines[2].startswith("exp.yaml:7: data[3].path: ") and "does not exist" in lines[2]
    assert any(x.startswith("exp.yaml:8: data[4].path: required field missing") for x in lines)
    assert any(x.startswith("exp.yaml:8: data[4].hash: must be a boolean") for x in lines)
    assert any(
        x.startswith("exp.yaml:9: data[5].hsh: unknown key; did you mean 'hash'?") for x in lines
    )
    assert any(x.startswith("exp.yaml:10: data[6]: ") and "UNDEFINED" in x for x in lines)
    Path("exp.yaml").write_text("name: t\nentrypoint: python t.py\ndata: ds\n")
    with pytest.raises(ConfigError, match=r"exp.yaml:3: data: must be a list of paths"):
        load_experiment("exp.yaml", environ=env)


# --- deterministic switches ------------------------------------------------------------


def test_deterministic_switches_in_worker_env_and_init(tmp_path: Path) -> None:
    from dlhpc.harness.worker import _child_env

    spec = TrialSpec(**{**_spec_fields(), "seed": 1234, "deterministic": True})
    env = _child_env(spec, tmp_path, tmp_path / "a")
    assert env["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8" and env["PYTHONHASHSEED"] == "1234"
    user = TrialSpec(**{**_spec_fields(), "deterministic": True, "env": {"PYTHONHASHSEED": "0"}})
    assert _child_env(user, tmp_path, tmp_path / "a")["PYTHONHASHSEED"] == "0"  # theirs wins
    plain = _child_env(TrialSpec(**_spec_fields()), tmp_path, tmp_path / "a")
    assert plain.get("CUBLAS_WORKSPACE_CONFIG") == os.environ.get("CUBLAS_WORKSPACE_CONFIG")

    pytest.importorskip("torch")
    spec.write(tmp_path / "trial.json")
    script = (
        "import sys, dlhpc\n"
        "ctx = dlhpc.init()\n"
        "assert 'torch' not in sys.modules, 'init imported torch'\n"
        "import torch\n"
        "assert not torch.are_deterministic_algorithms_enabled()\n"
        "ctx = dlhpc.init()\n"
        "assert torch.are_deterministic_algorithms_enabled()\n"
        "assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32\n"
        "assert not torch.backends.cudnn.benchmark\n"
        "g1, g2 = ctx.dataloader_generator(), ctx.dataloader_generator()\n"
        "assert torch.rand(3, generator=g1).equal(torch.rand(3, generator=g2))\n"
        "import pickle; assert pickle.loads(pickle.dumps(ctx.seed_worker)) is ctx.seed_worker\n"
        "ctx.seed_worker(0)\n"
        "print('ok')\n"
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith("DLHPC_")}
    proc = subprocess.run(
        [sys.executable, "-c", script],
        env={**base, "DLHPC_TRIAL_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
