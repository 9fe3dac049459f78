"""Group mode with two Unix users of one lab group, on the dev cluster.

Users ``dlhpc-lab-a`` and ``dlhpc-lab-b`` (group ``dlhpc-lab``; made in this cluster's
world when missing) share one lab folder. Each launches a one-trial experiment as a
real Slurm job; once A's has ended, B tries what docs/SECURITY.md ("Group mode") says a
member cannot do to another: edit A's ``entry.sh``, ``trial.json`` or code snapshot,
put a forged exit record in A's trial folder, change A's rows with sqlite3, move A's
folder aside, and kill, gc or pin A's experiment. Each is refused, A's ticks succeed,
A's experiment stays as it ended (A's, one trial), and B's lab view (``report
--all``) lists both members' experiments.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import REPO, let_others_pass

pytestmark = [pytest.mark.cluster, pytest.mark.needs("root")]

GROUP, GID = "dlhpc-lab", 2790
USERS = {"dlhpc-lab-a": 2791, "dlhpc-lab-b": 2792}
A, B = USERS

TRAIN = """\
from pathlib import Path

import dlhpc
from dlhpc.protocol.checkpoint import publish_checkpoint

ctx = dlhpc.init()


class Weights:
    step = 1

    def save(self):
        write = lambda folder: (folder / "w.bin").write_bytes(b"w")
        return publish_checkpoint(Path(ctx.checkpoint_dir), 1, write)


ctx.report(1, {"loss": 0.25})
ctx.checkpoint(Weights())
ctx.close()
"""

EXPERIMENT = """\
name: lab-{who}
entrypoint: python train.py
resources: {{cpus_per_task: 1, mem: "256M", time: "00:05:00"}}
searcher: {{name: single, metric: loss, max_length: 1}}
"""


def _ensure_users() -> None:
    """The lab group and its two members in this world (same ids on every run)."""
    try:
        grp.getgrnam(GROUP)
    except KeyError:
        subprocess.run(["groupadd", "-g", str(GID), GROUP], check=True)
    for user, uid in USERS.items():
        try:
            pwd.getpwnam(user)
        except KeyError:
            subprocess.run(
                ["useradd", "-u", str(uid), "-g", GROUP, "-M", "-N", "-s", "/bin/sh", user],
                check=True,
            )


@pytest.fixture
def lab(slurm_env: dict[str, str]) -> Iterator[tuple[Path, dict[str, str]]]:
    """A folder both users reach (pytest's own is root's alone): the lab's site file,
    each user's experiment folder, and the lab folder; the environment of dlhpc."""
    _ensure_users()
    base = Path(tempfile.mkdtemp(prefix="dlhpc-lab-", dir="/tmp"))
    os.chmod(base, 0o755)
    # what the lab's admin makes: the lab folder and users/, the group's, 3770 (a sticky
    # folder's owner may still rename its entries, so no member may own users/)
    for folder in (base / "lab", base / "lab" / "users"):
        folder.mkdir()
        shutil.chown(folder, group=GROUP)
        os.chmod(folder, 0o3770)
    site = (REPO / "site-configs" / "dev-cluster.yaml").read_text()
    (base / "site.yaml").write_text(f"{site}\npermissions: {{mode: group, group: {GROUP}}}\n")
    for user in USERS:
        work = base / user
        work.mkdir()
        (work / "train.py").write_text(TRAIN)
        (work / "exp.yaml").write_text(EXPERIMENT.format(who=user))
        shutil.chown(work, user, GROUP)
        for f in work.iterdir():
            shutil.chown(f, user, GROUP)
    env = {
        **slurm_env,
        "DLHPC_HOME": str(base / "lab"),
        "DLHPC_SITE": str(base / "site.yaml"),
        "PYTHONPATH": str(REPO),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    for path in (REPO, Path(sys.executable).resolve(), Path(sys.prefix)):
        let_others_pass(path)
    reach = _as(A, env, sys.executable, "-c", "import dlhpc")
    assert reach.returncode == 0, (
        f"{A} cannot run {sys.executable} with the checkout {REPO} (every folder above them"
        f" must let others pass, as for the strict profile's user): {reach.stderr}"
    )
    yield base, env
    subprocess.run(["scancel", "-u", A], env=slurm_env, check=False)
    subprocess.run(["scancel", "-u", B], env=slurm_env, check=False)
    shutil.rmtree(base, ignore_errors=True)


def _start(
    user: str, env: dict[str, str], *argv: str, cwd: Path | None = None
) -> subprocess.Popen[str]:
    """``argv`` started as ``user`` (lab group only), in ``cwd``."""
    return subprocess.Popen(
        argv,
        user=user,
        group=GROUP,
        extra_groups=[GROUP],
        env={**env, "HOME": "/tmp", "USER": user, "LOGNAME": user},
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _done(proc: subprocess.Popen[str]) -> subprocess.CompletedProcess[str]:
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _as(
    user: str, env: dict[str, str], *argv: str, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``argv`` run as ``user`` (lab group only), in ``cwd``."""
    return _done(_start(user, env, *argv, cwd=cwd))


def _dlhpc(
    user: str, env: dict[str, str], *args: str, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return _as(user, env, sys.executable, "-m", "dlhpc", *args, cwd=cwd)


def _try_write(
    user: str, env: dict[str, str], path: Path, mode: str = "a"
) -> subprocess.CompletedProcess[str]:
    code = f"open({str(path)!r}, {mode!r}).write('touch /tmp/pwned\\n')"
    return _as(user, env, sys.executable, "-c", code)


def _status(user: str, env: dict[str, str]) -> dict[str, Any]:
    res = _dlhpc(user, env, "status", "1", "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["experiments"][0]  # type: ignore[no-any-return]


def _state(home: Path) -> str:
    """The experiment's state, read as the lab reads it (read-only, no dlhpc start-up)."""
    with sqlite3.connect(f"file:{home / 'dlhpc.db'}?mode=ro", uri=True) as db:
        return str(db.execute("SELECT state FROM experiments").fetchone()[0])


def test_a_lab_member_cannot_touch_anothers_experiment(
    lab: tuple[Path, dict[str, str]],
) -> None:
    base, env = lab
    dlhpc = (sys.executable, "-m", "dlhpc")
    launches = [_start(u, env, *dlhpc, "launch", "exp.yaml", "--json", cwd=base / u) for u in USERS]
    for res in map(_done, launches):
        assert res.returncode == 0, res.stdout + res.stderr
    homes = {user: base / "lab" / "users" / user for user in USERS}
    deadline = time.monotonic() + 60
    while _state(homes[A]) == "ACTIVE":
        res = _dlhpc(A, env, "tick", "-q")
        assert res.returncode == 0, (res.stdout, res.stderr)
        assert time.monotonic() < deadline, _status(A, env)
        time.sleep(0.5)
    exp_a = next((homes[A] / "runs").iterdir())
    trial_a = next((exp_a / "trials").iterdir())
    attempt_a = next((trial_a / "attempts").iterdir())
    refused = {
        "entry.sh": _try_write(B, env, exp_a / "entry.sh"),
        "experiment.json": _try_write(B, env, exp_a / "experiment.json", "w"),
        "trial.json": _try_write(B, env, trial_a / "trial.json", "w"),
        "snapshot": _try_write(B, env, exp_a / "code" / "train.py"),
        "snapshot, new file": _try_write(B, env, exp_a / "code" / "evil.py", "w"),
        "forged exit": _try_write(B, env, attempt_a / "worker-r0-00000009.jsonl", "w"),
        "trial folder": _try_write(B, env, trial_a / "x.jsonl", "w"),
        "rows": _as(
            B,
            env,
            sys.executable,
            "-c",
            f"import sqlite3; c = sqlite3.connect({str(homes[A] / 'dlhpc.db')!r});"
            f" c.execute(\"UPDATE experiments SET user = '{B}'\"); c.commit()",
        ),
        "move A's folder": _as(B, env, "mv", str(homes[A]), str(homes[A]) + ".x"),
    }
    for what, res in refused.items():
        assert res.returncode != 0, what
        denied = ("Permission denied", "Operation not permitted", "readonly database")
        assert any(d in res.stderr for d in denied), (what, res.stderr)
    # B pointing dlhpc at A's folder: every change is refused, exit 2
    theirs = {**env, "DLHPC_HOME": str(homes[A]), "DLHPC_SITE": "dev-cluster"}
    changes = [_start(B, theirs, *dlhpc, cmd, "1") for cmd in ("kill", "gc", "pin")]
    for res in map(_done, changes):
        assert res.returncode == 2 and f"belongs to {A}" in res.stderr, (res.args, res.stderr)
    assert _dlhpc(A, env, "tick", "-q").returncode == 0
    exp = _status(A, env)
    assert exp["state"] == "COMPLETED" and exp["user"] == A, exp
    assert [t["state"] for t in exp["trials"]] == ["COMPLETED"], exp["trials"]
    with sqlite3.connect(f"file:{homes[A] / 'dlhpc.db'}?mode=ro", uri=True) as db:
        assert db.execute("SELECT user FROM experiments").fetchall() == [(A,)]
    assert "pwned" not in (exp_a / "entry.sh").read_text()
    out = base / "pages"
    out.mkdir()
    shutil.chown(out, B, GROUP)
    res = _dlhpc(B, env, "report", "--all", "--out-dir", str(out))
    assert res.returncode == 0, res.stderr
    index = (out / "index.html").read_text()
    for user in USERS:
        assert f'href="{user}/exp-000001.html"' in index and f"lab-{user}" in index
