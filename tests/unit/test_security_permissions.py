"""The site's permission policy on real files made by real commands.

A local-backend experiment is launched, ticked to its end (its script saves
checkpoints through the harness), reported and exported; then every file and
folder under the state folder, the checkpoint folder, the report folder and the
export has the mode the policy asks for: private (nothing for group or others),
or group (the lab group owns every folder, setgid; group can read; others nothing).
"""

from __future__ import annotations

import grp
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from dlhpc._perms import current_umask, current_user
from dlhpc.config import load_site
from dlhpc.errors import ConfigError, StoreError
from dlhpc.protocol import atomic_write_text
from dlhpc.protocol.layout import CODE_DIR, LAUNCH_ENV_FILE
from dlhpc.store import Store
from tests.unit._cli import run, until_over

GROUP = "users"  # exists on Debian; the tests run as root, who may give files to any group

TRAIN = """\
import dlhpc
from pathlib import Path
from dlhpc.protocol.checkpoint import publish_checkpoint

ctx = dlhpc.init()


class Weights:
    step = 0

    def save(self):
        write = lambda folder: (folder / "w.bin").write_bytes(b"weights")
        return publish_checkpoint(Path(ctx.checkpoint_dir), self.step, write)


w = Weights()
for step in range(1, ctx.max_length + 1):
    ctx.report(step, {"loss": 1.0 / step})
    w.step = step
    ctx.checkpoint(w)
ctx.close()
"""


@pytest.fixture(autouse=True)
def _keep_umask() -> Iterator[None]:
    mask = os.umask(0o022)  # a typical login umask: whatever is stricter comes from dlhpc
    yield
    os.umask(mask)


def _site(tmp_path: Path, permissions: str) -> Path:
    f = tmp_path / "site.yaml"
    f.write_text(f"name: lab\nbackend: local\n{permissions}")
    return f


def _run_experiment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, site: Path) -> list[Path]:
    """Launch, tick to the end, report, export; the folders dlhpc created."""
    home, ckpt = tmp_path / "home", tmp_path / "ckpt"
    monkeypatch.setenv("DLHPC_HOME", str(home))
    monkeypatch.setenv("DLHPC_SITE", str(site))
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text(TRAIN)
    (work / "exp.yaml").write_text(
        "name: perms\nentrypoint: python train.py\n"
        f"searcher: {{name: single, metric: loss, max_length: 2}}\ncheckpoint: {{dir: {ckpt}}}\n"
    )
    res = run("launch", str(work / "exp.yaml"), "--json")
    assert res.exit_code == 0, res.output
    exp_id = json.loads(res.output)["experiment_id"]
    assert until_over(exp_id)["state"] == "COMPLETED"
    reports = tmp_path / "reports"
    for args in (["-o", str(reports / "one" / "p.html")], ["--all", "--out-dir", str(reports)]):
        res = run("report", *([str(exp_id)] if "-o" in args else []), *args)
        assert res.exit_code == 0, res.output
    trial = run("status", str(exp_id), "--json")
    trial_id = json.loads(trial.output)["experiments"][0]["trials"][0]["id"]
    res = run("export", str(trial_id), str(tmp_path / "exports" / "t1"))
    assert res.exit_code == 0, res.output
    assert (tmp_path / "exports" / "t1" / "checkpoint" / "w.bin").is_file()
    return [home, ckpt, reports, tmp_path / "exports"]


def _tree(roots: list[Path]) -> Iterator[tuple[Path, os.stat_result]]:
    for root in roots:
        yield root, os.lstat(root)
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames + filenames:
                p = Path(dirpath) / name
                yield p, os.lstat(p)


def _kinds(roots: list[Path]) -> set[str]:
    """What the walk saw, so that a test cannot pass on an empty tree."""
    names = {p.name for p, _ in _tree(roots)}
    return {
        kind
        for kind, probe in {
            "db": "dlhpc.db",
            "trial spec": "trial.json",
            "entry": "entry.sh",
            "code snapshot": "train.py",
            "heartbeat": "heartbeat.json",
            "manifest": "MANIFEST.json",
            "weights": "w.bin",
            "index": "index.html",
            "metrics export": "metrics.csv",
        }.items()
        if probe in names
    } | ({"events"} if any(n.startswith("worker-r0-") for n in names) else set())


def test_private_by_default_nothing_for_group_or_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    roots = _run_experiment(tmp_path, monkeypatch, _site(tmp_path, ""))
    assert len(_kinds(roots)) == 10, _kinds(roots)
    loose = [
        f"{p} {stat.filemode(st.st_mode)}"
        for p, st in _tree(roots)
        if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o077
    ]
    assert loose == []
    assert stat.S_IMODE((tmp_path / "home" / "dlhpc.db").stat().st_mode) == 0o600


def test_group_mode_each_member_writes_alone_and_the_lab_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gid = grp.getgrnam(GROUP).gr_gid
    roots = _run_experiment(
        tmp_path, monkeypatch, _site(tmp_path, f"permissions: {{mode: group, group: {GROUP}}}\n")
    )
    assert len(_kinds(roots)) == 10, _kinds(roots)
    lab, mine = tmp_path / "home", tmp_path / "home" / "users" / current_user()
    wrong = []
    for p, st in _tree(roots):
        if stat.S_ISLNK(st.st_mode):
            continue
        mode = st.st_mode
        ok = st.st_gid == gid and not mode & 0o027 and mode & stat.S_IRGRP
        if p in (lab, lab / "users"):  # where members make their folders: sticky, the group's
            ok = st.st_gid == gid and stat.S_IMODE(mode) == 0o3770
        elif p.name == LAUNCH_ENV_FILE:  # the launch's environment: its owner's alone
            ok = st.st_gid == gid and stat.S_IMODE(mode) == 0o600
        elif stat.S_ISDIR(mode):
            ok = ok and bool(mode & stat.S_ISGID) and mode & 0o050 == 0o050
        if p.is_relative_to(mine / "runs") and p.relative_to(mine / "runs").parts[1:2] == (
            CODE_DIR,
        ):  # the code snapshot: the lab reads it, nobody writes it
            ok = ok and not mode & 0o222
        if not ok:
            wrong.append(f"{p} {stat.filemode(mode)} gid {st.st_gid}")
    assert wrong == []
    assert (mine / "runs").is_dir() and not (lab / "runs").exists()
    assert stat.S_IMODE(os.stat(mine / "dlhpc.db").st_mode) == 0o640
    index = (tmp_path / "reports" / "index.html").read_text()
    assert f'href="{current_user()}/exp-000001.html"' in index
    assert (tmp_path / "reports" / current_user() / "exp-000001.html").is_file()


def test_atomic_writes_follow_the_umask_not_mkstemps_0600(tmp_path: Path) -> None:
    for mask, want in ((0o007, 0o660), (0o077, 0o600), (0o027, 0o640)):
        os.umask(mask)
        assert current_umask() == mask
        atomic_write_text(tmp_path / f"f{mask:o}", "x")
        assert stat.S_IMODE((tmp_path / f"f{mask:o}").stat().st_mode) == want


def test_permissions_section_is_validated_with_file_and_line(tmp_path: Path) -> None:
    cases = {
        "permissions: {mode: group}\n": "permissions.mode: mode: group needs 'group:",
        "permissions: {mode: group, group: no-such-group-x}\n": "no unix group 'no-such-group-x'",
        "permissions:\n  umask: 22\n": "permissions.umask: must be a quoted octal umask",
        "permissions:\n  umask: '020'\n": "020 lets everyone write",
        f"permissions: {{mode: group, group: {GROUP}, umask: '002'}}\n": "group mode needs x27",
        f"permissions: {{mode: group, group: {GROUP}, umask: '007'}}\n": "lets the group write",
        f"permissions: {{mode: group, group: {GROUP}, others_experiments: write}}\n": (
            "permissions.others_experiments: group mode keeps each member's state"
        ),
        "permissions: {mode: shared}\n": "must be one of private, group",
        "permissions: {others: write}\n": "unknown key",
        "permissions: [private]\n": "must be a mapping",
    }
    for text, message in cases.items():
        with pytest.raises(ConfigError) as err:
            load_site(str(_site(tmp_path, text)))
        assert message in str(err.value), (text, str(err.value))
        assert f"{tmp_path / 'site.yaml'}:3" in str(err.value) or ":4" in str(err.value)
    res = run("status", "--site", str(_site(tmp_path, "permissions: {mode: group}\n")))
    assert res.exit_code == 2 and "site.yaml:3: permissions.mode" in res.output
    site = load_site(str(_site(tmp_path, "permissions: {umask: '027', others_experiments: write}")))
    assert (site.permissions.umask, site.permissions.others_experiments) == (0o027, "write")
    assert load_site(str(_site(tmp_path, ""))).permissions.umask == 0o077


def test_a_world_writable_db_is_repaired_if_ours_and_refused_if_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    Store(home).close()
    db = home / "dlhpc.db"
    os.chmod(db, 0o666)
    Store(home).close()
    assert stat.S_IMODE(db.stat().st_mode) == 0o664
    assert "was world-writable (mode 0666); now 0664" in capsys.readouterr().err

    os.chmod(db, 0o666)
    os.chown(db, 65534, -1)  # nobody's: we may not repair it, nor trust it
    with pytest.raises(StoreError, match="world-writable .* belongs to nobody; refusing"):
        Store(home)
    monkeypatch.setenv("DLHPC_HOME", str(home))
    res = run("status", "--site", "local")
    assert res.exit_code == 1 and "refusing to use it" in res.output
    res = run("doctor", "--site", "local", "--json")
    assert res.exit_code == 1
    checks = json.loads(res.output[: res.output.rindex("}") + 1])["checks"]
    db_check = next(c for c in checks if c["name"] == "dlhpc.db mode")
    assert db_check["status"] == "fail" and "chmod o-w" in db_check["detail"]
    os.chmod(db, 0o600)
    os.chown(db, 0, -1)
    res = run("doctor", "--site", "local", "--json")
    checks = json.loads(res.output[: res.output.rindex("}") + 1])["checks"]
    statuses = {c["name"]: c["status"] for c in checks}
    assert statuses["dlhpc.db mode"] == "ok" and statuses["permission policy"] == "ok"
