"""Another user's experiments in a shared lab DB are read-only unless the site allows it.

The user is faked at its one boundary (:func:`dlhpc._perms.current_user`) for the
command matrix; one test runs real commands as the real unix user ``nobody``
in a group-mode lab folder, beside root's own state folder.
"""

from __future__ import annotations

import grp
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from dlhpc import _perms
from dlhpc.config import load_site
from dlhpc.report.build import page_file
from dlhpc.store import Checkpoint, Experiment, Store, Trial
from tests.unit._cli import TRAIN, run, status, until_over
from tests.unit._db import add_experiment, add_trial

GROUP = "users"
CKPT_TRAIN = TRAIN.replace(
    "    ctx.report(step, {'loss': ctx.hparams['x'] / step})\n",
    "    ctx.report(step, {'loss': ctx.hparams['x'] / step})\n    ctx.checkpoint(W(step))\n",
).replace(
    "ctx = dlhpc.init()\n",
    "ctx = dlhpc.init()\n"
    "from pathlib import Path\n"
    "from dlhpc.protocol.checkpoint import publish_checkpoint\n"
    "class W:\n"
    "    def __init__(self, step): self.step = step\n"
    "    def save(self):\n"
    "        return publish_checkpoint(Path(ctx.checkpoint_dir), self.step,\n"
    "                                  lambda f: (f / 'w').write_bytes(b'w'))\n",
)


def _as(monkeypatch: pytest.MonkeyPatch, user: str) -> None:
    monkeypatch.setattr(_perms, "current_user", lambda: user)


@pytest.fixture
def alices(tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    """Alice's experiment: two trials, one at a time, so the second waits for a tick."""
    site = tmp_path / "site.yaml"
    site.write_text("name: lab\nbackend: local\n")
    monkeypatch.setenv("DLHPC_SITE", str(site))
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text(CKPT_TRAIN)
    (work / "exp.yaml").write_text(
        "name: alices\nentrypoint: python train.py\n"
        "hyperparameters: {x: {type: categorical, vals: [0.1, 0.2]}}\n"
        "searcher: {name: grid, metric: loss, max_length: 2, max_concurrent_trials: 1}\n"
    )
    _as(monkeypatch, "alice")
    res = run("launch", str(work / "exp.yaml"), "--json")
    assert res.exit_code == 0, res.output
    return int(json.loads(res.output)["experiment_id"])


def _first_job_ended(root: Path, timeout: float = 60) -> None:
    """Wait until the local runner under ``root`` records its first task as ended."""
    deadline = time.monotonic() + timeout
    while not any('"COMPLETED"' in p.read_text() for p in root.rglob("status/0.json")):
        assert time.monotonic() < deadline, "alice's first job never ended"
        time.sleep(0.1)


def test_another_users_tick_leaves_the_experiment_alone(
    alices: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _as(monkeypatch, "bob")
    _first_job_ended(tmp_path)  # alice's first trial has finished: a tick would ingest and submit
    for _ in range(3):
        res = run("tick", "--json")
        assert res.exit_code == 0 and json.loads(res.output)["experiments"] == 0, res.output
    exp = status(alices)
    # nothing ingested, no state change, the second trial neither created nor submitted
    assert [(t["state"], t["steps_completed"]) for t in exp["trials"]] == [("PENDING", 0)]
    _as(monkeypatch, "alice")
    done = until_over(alices)
    assert done["state"] == "COMPLETED" and len(done["trials"]) == 2


def test_others_may_read_but_not_change(alices: int, monkeypatch: pytest.MonkeyPatch) -> None:
    assert until_over(alices)["state"] == "COMPLETED"
    exp = status(alices)
    t1, t2 = (t["id"] for t in exp["trials"])
    with Store(Path(os.environ["DLHPC_HOME"])).read() as s:
        ckpt = s.scalars(select(Checkpoint.id).where(Checkpoint.state == "ACTIVE")).first()
        before = [(c.id, c.state, c.pinned) for c in s.scalars(select(Checkpoint))]
    assert ckpt is not None and len(before) >= 2
    _as(monkeypatch, "bob")
    for args in (
        ["status", str(alices), "--json"],
        ["report", str(alices), "-o", os.devnull],
        ["logs", str(t1)],
        ["checkpoints", str(alices)],
        ["diff", str(t1), str(t2)],
        ["gc", str(alices), "--dry-run"],
    ):
        res = run(*args)
        assert res.exit_code == 0, (args, res.output)
    for args in (
        ["kill", str(alices)],
        ["kill", "-t", str(t1)],
        ["pin", str(ckpt)],
        ["unpin", str(ckpt)],
        ["gc", str(alices)],
    ):
        res = run(*args)
        assert res.exit_code == 2, (args, res.output)
        assert f"experiment {alices} belongs to alice; you (bob) may only read it" in res.output
    res = run("gc")
    assert res.exit_code == 0 and f"read-only to you): [{alices}]" in res.output
    with Store(Path(os.environ["DLHPC_HOME"])).read() as s:
        assert [(c.id, c.state, c.pinned) for c in s.scalars(select(Checkpoint))] == before
    # a site that lets the lab change each other's experiments
    site = Path(os.environ["DLHPC_SITE"])
    site.write_text(site.read_text() + "permissions: {others_experiments: write}\n")
    res = run("pin", str(ckpt))
    assert res.exit_code == 0, res.output
    assert run("gc", str(alices)).exit_code == 0
    _as(monkeypatch, "alice")
    assert run("unpin", str(ckpt)).exit_code == 0  # the owner, under the default policy too


@pytest.fixture
def shared_base() -> Iterator[Path]:
    """A folder outside root's private tmp (pytest's is 0700), reachable by others."""
    base = Path(tempfile.mkdtemp(prefix="dlhpc-shared-", dir="/tmp"))
    base.chmod(0o755)
    mask = os.umask(0o022)
    yield base
    os.umask(mask)
    _perms.remove_tree(base, ignore_errors=True)  # it holds read-only code snapshots


def _nobody_python(env: dict[str, str]) -> list[str] | None:
    """A python that ``nobody`` can run with dlhpc importable, or None."""
    cmd = ["setpriv", "--reuid=nobody", f"--regid={GROUP}", "--clear-groups"]
    for python in (sys.executable, "/usr/bin/python3"):
        probe = subprocess.run(
            [*cmd, python, "-c", "import dlhpc.cli.main"], env=env, capture_output=True, check=False
        )
        if probe.returncode == 0:
            return [*cmd, python, "-m", "dlhpc"]
    return None


def test_a_real_other_member_reads_a_group_members_db_and_may_not_kill(
    shared_base: Path,
) -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run a command as another user")
    site = shared_base / "site.yaml"
    site.write_text(f"name: lab\nbackend: local\npermissions: {{mode: group, group: {GROUP}}}\n")
    site.chmod(0o644)
    lab = shared_base / "home"
    policy = load_site(str(site)).permissions
    os.umask(policy.umask)
    store = Store(lab, permissions=policy)
    home = store.home  # root's own folder in the lab's
    with store.write() as s:
        exp = add_experiment(s, home / "runs", name="roots", user=_perms.current_user())
        add_trial(s, exp, state="PENDING")
        exp_id = exp.id
    store.close()
    assert home.stat().st_gid == grp.getgrnam(GROUP).gr_gid
    paths = [str(Path(__file__).resolve().parents[2]), *(p for p in sys.path if p)]
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(shared_base),
        "DLHPC_HOME": str(lab),
        "DLHPC_SITE": str(site),
        "PYTHONPATH": os.pathsep.join(paths),
    }
    nobody = _nobody_python(env)
    if nobody is None:
        pytest.skip("no python that the user nobody can run with dlhpc importable")
    # nobody's commands use nobody's own state folder: root's experiment is not in it
    res = subprocess.run(
        [*nobody, "status", str(exp_id), "--json"], env=env, capture_output=True, text=True
    )
    assert res.returncode == 2 and f"no experiment {exp_id}" in res.stderr, res.stderr
    assert (lab / "users" / "nobody" / "dlhpc.db").is_file()
    pages = shared_base / "pages"  # the lab view, as nobody: root's experiment is there
    pages.mkdir()
    shutil.chown(pages, "nobody")
    res = subprocess.run(
        [*nobody, "report", "--all", "--out-dir", str(pages)], env=env, capture_output=True
    )
    assert res.returncode == 0, res.stderr
    assert "roots" in (pages / "root" / page_file(exp_id)).read_text()
    # pointed at root's folder: nobody reads it, and may not change it
    theirs = {**env, "DLHPC_HOME": str(home), "DLHPC_SITE": "local"}
    res = subprocess.run(
        [*nobody, "status", str(exp_id), "--json"], env=theirs, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["experiments"][0]["name"] == "roots"
    res = subprocess.run([*nobody, "kill", str(exp_id)], env=theirs, capture_output=True, text=True)
    assert res.returncode == 2
    assert f"experiment {exp_id} belongs to root; you (nobody) may only read it" in res.stderr
    with Store(home, read_only=True).read() as s:
        e = s.get(Experiment, exp_id)
        assert e is not None and e.state == "ACTIVE"
        assert s.scalars(select(Trial.state)).all() == ["PENDING"]
