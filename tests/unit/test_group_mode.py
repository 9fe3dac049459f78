"""Group mode's boundaries, as root on one machine: each member's state folder and
database, a squatted member folder, read-only opening of another member's database,
the lab view of every member's experiments, and doctor's permission checks.

The second member is ``nobody`` (uid 65534): its folder is made by faking the user at
its one boundary (:func:`dlhpc._perms.current_user`), then given to it. The two-user
attempts with real processes and Slurm jobs run on the dev cluster
(tests/integration/test_group_mode_cluster.py).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from dlhpc import _perms
from dlhpc.config import Permissions
from dlhpc.errors import StoreError
from dlhpc.store import Store, lab_databases
from tests.unit._cli import run
from tests.unit._db import add_experiment

GROUP = "users"
NOBODY = 65534


@pytest.fixture(autouse=True)
def _keep_umask() -> Iterator[None]:
    mask = os.umask(0o022)
    yield
    os.umask(mask)


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    site = tmp_path / "site.yaml"
    site.write_text(f"name: lab\nbackend: local\npermissions: {{mode: group, group: {GROUP}}}\n")
    monkeypatch.setenv("DLHPC_SITE", str(site))
    monkeypatch.setenv("DLHPC_HOME", str(tmp_path / "lab"))
    return tmp_path / "lab"


def _policy() -> Permissions:
    return Permissions("group", GROUP, 0o027)


def _member_store(lab: Path, user: str, monkeypatch: pytest.MonkeyPatch) -> Store:
    with monkeypatch.context() as m:
        m.setattr(_perms, "current_user", lambda: user)
        os.umask(0o027)
        return Store(lab, permissions=_policy())


def _give_to_nobody(folder: Path) -> None:
    for dirpath, _dirs, files in os.walk(folder):
        for p in [dirpath, *(os.path.join(dirpath, f) for f in files)]:
            os.lchown(p, NOBODY, -1)


def _nobody_with_an_experiment(lab: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    store = _member_store(lab, "nobody", monkeypatch)
    with store.write() as s:
        add_experiment(s, store.runs_root, name="nobodys", user="nobody", state="COMPLETED")
    store.close()
    _give_to_nobody(lab / "users" / "nobody")
    return lab / "users" / "nobody"


def test_each_member_has_a_folder_and_database_of_their_own(
    lab: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nobody = _nobody_with_an_experiment(lab, monkeypatch)
    mine = _member_store(lab, _perms.current_user(), monkeypatch)
    assert mine.home == lab / "users" / _perms.current_user() and mine.lab == lab
    assert stat.S_IMODE(os.stat(lab / "users").st_mode) == 0o3770
    assert stat.S_IMODE(os.stat(mine.home).st_mode) == 0o2750
    assert stat.S_IMODE(os.stat(mine.db_path).st_mode) == 0o640
    with mine.read() as s:
        assert s.connection().exec_driver_sql("SELECT count(*) FROM experiments").scalar() == 0
    mine.close()
    assert [name for name, _ in lab_databases(lab)] == ["nobody", _perms.current_user()]
    os.lchown(nobody, 0, -1)  # a folder named nobody that is not nobody's: a squatter's
    assert [name for name, _ in lab_databases(lab)] == [_perms.current_user()]


def test_a_member_folder_made_by_someone_else_is_refused(
    lab: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _member_store(lab, _perms.current_user(), monkeypatch).close()
    squatted = lab / "users" / "mallory"
    squatted.mkdir()
    os.chown(squatted, NOBODY, -1)
    with pytest.raises(StoreError, match="belongs to nobody, not to you"):
        _member_store(lab, "mallory", monkeypatch)


def test_another_members_database_opens_read_only(
    lab: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nobody = _nobody_with_an_experiment(lab, monkeypatch)
    theirs = Store(nobody, permissions=_policy(), read_only=True)
    with theirs.read() as s:
        rows = s.connection().exec_driver_sql("SELECT name, user FROM experiments").all()
    assert [tuple(r) for r in rows] == [("nobodys", "nobody")]
    with pytest.raises(StoreError, match="opened read-only"), theirs.write():
        pass
    with theirs.read() as s, pytest.raises(Exception, match="readonly database"):
        s.connection().exec_driver_sql("UPDATE experiments SET user = 'root'")
    theirs.close()
    with pytest.raises(StoreError, match="no state database"):
        Store(lab / "users" / "absent", read_only=True)
    with sqlite3.connect(nobody / "dlhpc.db") as db:  # nothing was changed
        assert db.execute("SELECT user FROM experiments").fetchall() == [("nobody",)]


def test_the_lab_view_shows_every_members_experiments(
    lab: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _nobody_with_an_experiment(lab, monkeypatch)
    me = _perms.current_user()
    store = _member_store(lab, me, monkeypatch)
    with store.write() as s:
        add_experiment(s, store.runs_root, name="mine", user=me, state="COMPLETED")
    store.close()
    web = Path(tempfile.mkdtemp(prefix="dlhpc-lab-pages-"))
    os.chmod(web, 0o711)  # passable by a web server, as --publish asks
    out = web / "pages"
    res = run("report", "--all", "--out-dir", str(out), "--publish")
    assert res.exit_code == 0, res.output
    assert "wrote 2 page(s)" in res.output
    index = (out / "index.html").read_text()
    for user, name in (("nobody", "nobodys"), (me, "mine")):
        assert f'href="{user}/exp-000001.html"' in index and name in index
        assert name in (out / user / "exp-000001.html").read_text()
        assert f"{user}&#x27;s experiments" in (out / user / "index.html").read_text()
        assert (out / user / "models.html").is_file()
        for published in (out / user, out / user / "exp-000001.html"):
            assert os.stat(published).st_mode & 0o004, published  # --publish: others read
    shutil.rmtree(web)


def _checks() -> dict[str, dict[str, str]]:
    res = run("doctor", "--json")
    data = json.loads(res.output[: res.output.rindex("}") + 1])
    return {c["name"]: c for c in data["checks"]}


def test_doctor_checks_the_lab_and_the_members_files(
    lab: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _nobody_with_an_experiment(lab, monkeypatch)
    store = _member_store(lab, _perms.current_user(), monkeypatch)
    entry = store.runs_root / "exp-000001-x" / "entry.sh"
    entry.parent.mkdir(parents=True)
    entry.write_text("true\n")
    os.chmod(entry, 0o640)
    store.close()
    checks = _checks()
    for name in ("lab folder lab/", "lab folder users/", "dlhpc.db mode", "run folders"):
        assert checks[name]["status"] == "ok", checks[name]
    assert checks["lab view"]["status"] == "ok" and "nobody" in checks["lab view"]["detail"]
    os.chmod(entry, 0o660)  # the group could add a line that runs as its owner
    checks = _checks()
    assert checks["run folders"]["status"] == "fail", checks["run folders"]
    assert str(entry) in checks["run folders"]["detail"]
    os.chmod(entry, 0o640)
    os.chmod(lab / "users", 0o2770)  # not sticky: a member could remove another's folder
    assert _checks()["lab folder users/"]["status"] == "fail"


def test_doctor_before_any_launch_makes_the_lab_folders_as_a_launch_would(lab: Path) -> None:
    checks = _checks()
    for folder in (lab, lab / "users"):
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o3770, folder
    assert stat.S_IMODE(os.stat(lab / "users" / _perms.current_user()).st_mode) == 0o2750
    assert checks["lab folder users/"]["status"] == "ok", checks["lab folder users/"]
    assert checks["state folder writable"]["status"] == "ok"
