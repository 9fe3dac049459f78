"""The lab view on the pages: tags, notes and model versions on the
experiment page, the index's user and tags columns and per-user filter, and
``dlhpc report --all --publish``, whose files' real modes on disk are checked in the
private (default), group and published modes."""

from __future__ import annotations

import grp
import html
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from dlhpc._perms import current_user
from dlhpc.config import Permissions
from dlhpc.report._html import IndexEntry, render_index
from dlhpc.report.build import page_file
from dlhpc.store import Store, utcnow
from tests.unit._cli import run
from tests.unit._db import add_experiment, add_trial
from tests.unit._lab_pages import CANARIES, OTHER_USER, Lab, make_lab

GROUP = "users"  # exists on Debian; the tests run as root, who may give files to any group


@pytest.fixture(autouse=True)
def _login_umask() -> Iterator[None]:
    mask = os.umask(0o022)  # a typical login umask: anything stricter comes from dlhpc
    yield
    os.umask(mask)


@pytest.fixture
def lab(home: Path, monkeypatch: pytest.MonkeyPatch) -> Lab:
    monkeypatch.setenv("DLHPC_SITE", "local")
    mask = os.umask(0o077)  # as the CLI would have made the state folder: private
    try:
        return make_lab(home)
    finally:
        os.umask(mask)


def _site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, permissions: str) -> None:
    f = tmp_path / "site.yaml"
    f.write_text(f"name: lab\nbackend: local\n{permissions}")
    monkeypatch.setenv("DLHPC_SITE", str(f))


def _group_lab(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Lab:
    """Group mode: the site, and the lab made in this member's folder of the lab folder
    ``home`` (``users/<user>/``), as the CLI would have made it."""
    _site(tmp_path, monkeypatch, f"permissions: {{mode: group, group: {GROUP}}}\n")
    mask = os.umask(0o027)
    try:
        Store(home, permissions=Permissions("group", GROUP, 0o027)).close()
        return make_lab(home / "users" / current_user())
    finally:
        os.umask(mask)


def _no_raw_canary(page: str, shown: tuple[str, ...] = CANARIES) -> None:
    """No canary as markup; those ``shown`` on the page as text."""
    for canary in CANARIES:
        assert canary not in page
    for canary in shown:
        assert html.escape(canary, quote=True) in page, canary
    assert "<script>window" not in page and "<img" not in page and "<svg onload" not in page


def test_experiment_page_shows_tags_notes_and_model_versions(lab: Lab, tmp_path: Path) -> None:
    out = tmp_path / "p.html"
    assert run("report", str(lab.mine), "-o", str(out)).exit_code == 0
    page = out.read_text()
    _no_raw_canary(page)
    section = page[page.index("<h2>Tags and notes</h2>") : page.index("<h2>Learning curves")]
    assert '<span class="tag">best</span>' in section
    assert "looks good &lt;script&gt;" in section and html.escape(OTHER_USER) in section
    assert f"<td>trial {lab.trials[0]}</td>" in section  # the trial's note, with its target
    assert "digits" + html.escape(CANARIES[2]) + ":1" in section  # name:version
    assert f'<td class="n">{lab.trials[0]}</td>' in section  # its trial, step 3, metric
    assert '<td class="n">3</td><td class="n">0.25</td>' in section
    trials = page[page.index("<h2>Trials</h2>") :]
    assert "<th>tags</th>" in trials and "<th>note</th>" in trials
    assert html.escape(CANARIES[2]) in trials  # trial 2's tag, in its row


def test_index_has_user_and_tags_columns_and_a_user_filter(lab: Lab, tmp_path: Path) -> None:
    res = run("report", "--all", "--out-dir", str(tmp_path / "site"))
    assert res.exit_code == 0, res.output
    index = (tmp_path / "site" / "index.html").read_text()
    _no_raw_canary(index, CANARIES[:2])  # in the name and an experiment tag
    rows = re.findall(r'<tr data-user="([^"]*)">(.*?)</tr>', index)
    users = {page_id: user for user, body in rows for page_id in re.findall(r"exp-(\d+)", body)}
    mine, other = f"{lab.mine:06d}", f"{lab.other:06d}"
    assert users == {mine: html.escape(current_user()), other: html.escape(OTHER_USER)}
    assert '<option value="*">everyone (2 users)</option>' in index
    assert f'<option value="{html.escape(OTHER_USER, quote=True)}">' in index
    assert '<span class="tag">paper</span>' in index
    assert "Every experiment of this state folder, with who launched each." in index


def test_index_says_when_it_is_a_lab_s_shared_folder(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lab = _group_lab(home, tmp_path, monkeypatch)
    assert run("report", "--all", "--out-dir", str(tmp_path / "site")).exit_code == 0
    index = (tmp_path / "site" / "index.html").read_text()
    assert f"shared state folder (group {GROUP}): every member&#x27;s experiments" in index
    assert f'href="{current_user()}/{page_file(lab.mine)}"' in index  # in the member's folder


def test_render_index_with_no_experiments() -> None:
    page = render_index([], 0.0)
    assert "everyone (0 users)" in page and "Experiments by user: none." in page
    one = IndexEntry(1, "n", "ACTIVE", "grid", "loss", None, 0, 0.0, 0.0, "x.html", "me")
    assert "everyone (1 user)" in render_index([one], 0.0)


@pytest.fixture
def web_root() -> Iterator[Path]:
    """A folder every user may pass through, as a web server's would be: outside pytest's
    own 0700 temporary folders (each ancestor must let others pass; /tmp does)."""
    root = Path(tempfile.mkdtemp(prefix="dlhpc-publish-"))
    os.chmod(root, 0o711)
    yield root
    shutil.rmtree(root)


def _modes(folder: Path) -> dict[str, int]:
    out = {".": os.stat(folder).st_mode}
    out.update({p.name: os.stat(p).st_mode for p in folder.iterdir()})
    return out


def test_private_by_default(lab: Lab, tmp_path: Path) -> None:
    assert run("report", "--all", "--out-dir", str(tmp_path / "site")).exit_code == 0
    modes = _modes(tmp_path / "site")
    assert {page_file(lab.mine), page_file(lab.other), "index.html"} <= set(modes)
    assert {n: stat.S_IMODE(m) for n, m in modes.items() if m & 0o077} == {}


def test_group_mode_shares_with_the_group_only(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lab = _group_lab(home, tmp_path, monkeypatch)
    assert run("report", "--all", "--out-dir", str(tmp_path / "site")).exit_code == 0
    gid = grp.getgrnam(GROUP).gr_gid
    site = tmp_path / "site"
    assert page_file(lab.mine) in _modes(site / current_user())
    for folder in (site, site / current_user()):
        assert os.stat(folder).st_gid == gid and os.stat(folder).st_mode & stat.S_ISGID
        for name, mode in _modes(folder).items():
            assert mode & stat.S_IRGRP and not mode & 0o027, (name, oct(mode))


@pytest.mark.parametrize("mode", ["private", "group"])
def test_published_pages_are_world_readable_and_the_state_folder_stays_private(
    home: Path,
    tmp_path: Path,
    web_root: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
    mode: str,
) -> None:
    if mode == "group":
        lab = _group_lab(home, tmp_path, monkeypatch)
    else:
        lab = request.getfixturevalue("lab")
        _site(tmp_path, monkeypatch, "")
        os.chmod(home, 0o700)
    web = web_root / "public_html"
    web.mkdir()
    os.chmod(web, 0o711)  # passable by the web server, not listable
    home_before = {p: os.stat(p).st_mode for p in [home, *home.rglob("*")]}
    out = web / "dlhpc" / "lab"  # two folders the report creates
    res = run("report", "--all", "--out-dir", str(out), "--publish")
    assert res.exit_code == 0, res.output
    assert "readable by others" in res.output
    for folder in (web / "dlhpc", out):
        st = os.stat(folder).st_mode
        assert st & 0o005 == 0o005 and not st & 0o002, (folder, oct(st))
    pages = out / current_user() if mode == "group" else out  # group: the member's folder
    assert page_file(lab.mine) in _modes(pages)
    for folder in {out, pages}:
        for name, st in _modes(folder).items():
            assert st & stat.S_IROTH and not st & 0o022, (name, oct(st))
    assert {p: os.stat(p).st_mode for p in [home, *home.rglob("*")]} == home_before
    assert not any(st & 0o007 for st in home_before.values())
    # a later rebuild with --publish (the cron line's) keeps them published
    assert run("report", "--all", "--out-dir", str(out), "--publish", "-q").exit_code == 0
    assert all(st & stat.S_IROTH for st in _modes(pages).values())


def test_publish_refuses_a_closed_parent_and_the_state_folder(
    lab: Lab, home: Path, tmp_path: Path
) -> None:
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    os.chmod(closed, 0o700)
    res = run("report", "--all", "--out-dir", str(closed / "web"), "--publish")
    assert res.exit_code == 2
    assert f"{closed} (mode 0700): chmod o+x {closed}" in res.output
    assert "nothing was written" in res.output and not (closed / "web").exists()
    res = run("report", "--all", "--out-dir", str(home / "pages"), "--publish")
    assert res.exit_code == 2 and "inside the state folder" in res.output
    assert not (home / "pages").exists()
    res = run("report", str(lab.mine), "--publish")
    assert res.exit_code == 2 and "--publish go with --all" in res.output


def test_cron_line_publishes_and_checks_the_folder_first(
    lab: Lab, tmp_path: Path, web_root: Path
) -> None:
    res = run("cron", "--out-dir", str(web_root / "dlhpc"), "--publish")
    assert res.exit_code == 0, res.output
    line = res.output.splitlines()[-1]
    assert line.endswith(f"report --all --out-dir {web_root / 'dlhpc'} -q --publish"), line
    assert not run("cron").output.rstrip().endswith("--publish")
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    res = run("cron", "--out-dir", str(closed / "web"), "--publish")
    assert res.exit_code == 2 and f"chmod o+x {closed}" in res.output


def test_an_ended_experiment_s_page_is_rebuilt_when_its_lab_rows_change(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ended experiment's page is kept by a rebuild, unless a tag, note or model
    version of it (or of its trials) was added or removed since it was written."""
    monkeypatch.setenv("DLHPC_SITE", "local")
    store = Store(home)
    ended = utcnow() - timedelta(hours=1)
    with store.write() as s:
        exp = add_experiment(s, home / "r", name="done", state="COMPLETED", ended_at=ended)
        trial = add_trial(s, exp, state="COMPLETED").id
        exp_id = exp.id
    out = tmp_path / "site"

    def rebuild() -> str:
        res = run("report", "--all", "--out-dir", str(out))
        assert res.exit_code == 0, res.output
        return res.output

    page = out / page_file(exp_id)
    assert "wrote 1 page(s)" in rebuild()
    assert "1 unchanged page(s) kept" in rebuild()
    for change in (("tag", "+best"), ("note", "why"), ("tag", "-best"), ("tag", "+x", "-t")):
        args = [change[0], str(exp_id), *change[1:]] + ([str(trial)] if change[-1] == "-t" else [])
        assert run(*args).exit_code == 0
        assert "wrote 1 page(s)" in rebuild(), change
        assert "1 unchanged page(s) kept" in rebuild(), change
    text = page.read_text()
    assert '<span class="tag">x</span>' in text and "why" in text
    assert '<dd class="tags"><span class="mute">none</span>' in text  # best: removed again
