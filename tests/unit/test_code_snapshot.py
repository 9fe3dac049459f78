"""The code snapshot: the same files as the record's manifest (``.gitignore`` as git
applies it), read-only once published, and each trial's working folder beside it."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from dlhpc._perms import remove_tree
from dlhpc.errors import UsageError
from dlhpc.harness._workfolder import prepare_work_dir
from dlhpc.orchestrator.runfiles import publish_staging, snapshot_code, stage_run_folder
from dlhpc.protocol import code_dir, experiment_dir
from dlhpc.repro import code_files, code_record
from tests._config import load_experiment


def ignore_tree(work: Path) -> dict[str, str]:
    """A workdir with nested ``.gitignore`` files and negations; returns the files git
    keeps (path -> text), ``.gitignore`` files included."""
    (work / "sub" / "deep").mkdir(parents=True)
    (work / ".gitignore").write_text(
        "# comment\n*.log\n!keep.log\ndata/\n/top.txt\nbuild/\n!build/again.txt\n"
        "docs/*.md\n!docs/README.md\n"
    )
    (work / "sub" / ".gitignore").write_text("*.tmp\n!important.log\n/local.txt\n")
    (work / "sub" / "deep" / ".gitignore").write_text("!x.tmp\n")
    kept = {
        "train.py": "print(1)\n",
        "keep.log": "kept\n",
        "sub/top.txt": "not anchored here\n",
        "sub/m.py": "m\n",
        "sub/important.log": "re-included by the deeper file\n",
        "sub/deep/x.tmp": "re-included two levels down\n",
        "sub/deep/local.txt": "anchored to sub/ only\n",
        "docs/README.md": "negated\n",
        "docs/api/ref.md": "a glob's * stops at /\n",
    }
    ignored = (
        "a.log", "data/big.bin", "top.txt", "sub/x.tmp", "sub/local.txt", "sub/deep/y.tmp",
        "build/again.txt", "build/out.o", "docs/guide.md", ".venv/lib/site.py", "m.pyc",
    )  # fmt: skip
    for rel, text in [*kept.items(), *((r, "ignored\n") for r in ignored)]:
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(text)
    for rel in (".gitignore", "sub/.gitignore", "sub/deep/.gitignore"):
        kept[rel] = (work / rel).read_text()
    return kept


def _tree_shas(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in root.rglob("*")
        if p.is_file()
    }


def test_snapshot_is_the_manifest_of_the_record(tmp_path: Path) -> None:
    work = tmp_path / "work"
    kept = ignore_tree(work)
    (work / "runs").mkdir()  # the state folder inside the workdir: in neither
    (work / "runs" / "x.py").write_text("state\n")
    snapshot_code(work, tmp_path / "snap", skip=work / "runs")
    record = code_record(work, skip=work / "runs")
    assert _tree_shas(tmp_path / "snap") == record["manifest"]
    assert sorted(record["manifest"]) == sorted(kept)
    # in a git work tree: git's list, tracked and untracked files alike
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    subprocess.run(["git", "-C", str(work), "add", "train.py", "sub"], check=True)
    snapshot_code(work, tmp_path / "snap-git", skip=work / "runs")
    assert sorted(_tree_shas(tmp_path / "snap-git")) == code_files(work, work / "runs")[0]
    assert sorted(_tree_shas(tmp_path / "snap-git")) == sorted(kept)


def test_a_git_submodule_is_in_the_snapshot(tmp_path: Path) -> None:
    lib, work = tmp_path / "lib", tmp_path / "work"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "protocol.file.allow=always"]
    for repo in (lib, work):
        subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (lib / "layers.py").write_text("WIDTH = 3\n")
    subprocess.run([*git, "-C", str(lib), "add", "layers.py"], check=True)
    subprocess.run([*git, "-C", str(lib), "commit", "-qm", "lib"], check=True)
    (work / "train.py").write_text("import lib.layers\n")
    subprocess.run([*git, "-C", str(work), "submodule", "-q", "add", str(lib), "lib"], check=True)
    snapshot_code(work, tmp_path / "snap", skip=work / "runs")
    got = sorted(_tree_shas(tmp_path / "snap"))
    assert got == [".gitmodules", "lib/layers.py", "train.py"]
    assert got == code_files(work, work / "runs")[0]


def test_snapshot_past_the_limit_copies_nothing(tmp_path: Path) -> None:
    work = tmp_path / "work"
    ignore_tree(work)
    with pytest.raises(UsageError, match=r"MiB \(limit 0 MiB\) to snapshot"):
        snapshot_code(work, tmp_path / "snap", skip=work / "runs", limit=10)
    assert not (tmp_path / "snap").exists()


def _no_write_bits(root: Path) -> list[str]:
    """Paths under ``root`` (itself included) that still have a write bit."""
    paths = [root, *root.rglob("*")]
    return [
        f"{p} {stat.filemode(p.lstat().st_mode)}"
        for p in paths
        if not p.is_symlink() and p.lstat().st_mode & 0o222
    ]


def _published(tmp_path: Path) -> tuple[Path, Path]:
    """A workdir whose script imports its own module and reads a relative data file,
    published as experiment 1's run folder; returns (workdir, run folder)."""
    work = tmp_path / "work"
    (work / "data").mkdir(parents=True)
    (work / "helper.py").write_text("WHO = 'helper'\n")
    (work / "data" / "labels.csv").write_text("a,b\n")
    (work / "train.py").write_text(
        "import os, helper\n"
        "print(helper.WHO, open('data/labels.csv').read().strip(), os.getcwd())\n"
        "os.makedirs('lightning_logs/version_1', exist_ok=True)\n"  # a framework's default
        "open('lightning_logs/version_1/last.ckpt', 'w').write('w')\n"
    )
    (work / "exp.yaml").write_text("name: t\nentrypoint: python train.py\n")
    cfg = load_experiment(work / "exp.yaml", site="local")
    runs = tmp_path / "runs"
    exp_dir = experiment_dir(runs, 1, "t")
    publish_staging(stage_run_folder(cfg, runs), cfg, exp_dir, 1)
    return work, exp_dir


def test_published_snapshot_is_read_only_and_removable(tmp_path: Path) -> None:
    work, exp_dir = _published(tmp_path)
    code = code_dir(exp_dir)
    assert _no_write_bits(code) == []  # what root, who ignores them, is still shown
    if os.geteuid() != 0:  # an unprivileged user (the strict profile) is refused
        for attempt in (lambda: (code / "train.py").write_text("x"), lambda: (code / "n").mkdir()):
            try:
                attempt()
            except PermissionError:
                continue
            raise AssertionError("a trial could write into the snapshot")
    # dlhpc reproduce copies it as it is, and its staging folder can be removed
    cfg = load_experiment(work / "exp.yaml", site="local")
    staging = stage_run_folder(cfg, tmp_path / "runs", code_from=code)
    assert _tree_shas(code_dir(staging)) == _tree_shas(code)
    remove_tree(staging)
    remove_tree(exp_dir)
    assert not staging.exists() and not exp_dir.exists()


def test_trial_runs_in_its_own_folder_and_finds_the_snapshot(tmp_path: Path) -> None:
    _work, exp_dir = _published(tmp_path)
    code = code_dir(exp_dir)
    before = _tree_shas(code)
    work = prepare_work_dir(code, tmp_path / "trial" / "work")
    assert prepare_work_dir(code, work) == work  # again (a restart, another rank): the same
    assert sorted(os.listdir(work)) == sorted(os.listdir(code))
    assert all(os.readlink(work / n) == os.path.join("..", "..", "runs", exp_dir.name, "code", n)
               for n in os.listdir(code))  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "train.py"], cwd=work, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["helper", "a,b", str(work)]
    assert (work / "lightning_logs" / "version_1" / "last.ckpt").read_text() == "w"
    assert _tree_shas(code) == before
