"""Two lab members whose first launches make the lab folder at the same moment (group
mode) both succeed: the one whose ``mkdir`` finds the folder made meanwhile leaves it
to its maker (never chowns or chmods another's folder) and waits until it is the
lab's, then makes its own folder in it.

Real processes of two unprivileged users (forked from root, as on a lab's login node:
another uid, the lab group as their group); each ``mkdir`` is delayed so that both
find the folders absent before either makes them, whatever the machine's load."""

from __future__ import annotations

import grp
import multiprocessing
import os
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dlhpc import _perms
from dlhpc.config import Permissions

GROUP = "users"
MEMBERS = (65534, 65533)  # nobody, and a uid without a name

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="forks processes of other users")


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A folder every user may make entries in (like /tmp: sticky, world-writable)."""
    folder = Path(tempfile.mkdtemp(dir="/tmp"))
    os.chmod(folder, 0o1777)
    yield folder
    _perms.remove_tree(folder)


def _member(uid: int, gid: int, lab: Path, barrier: Any, errors: Any) -> None:
    real_mkdir = os.mkdir

    def slow_mkdir(path: Any, *args: Any, **kwargs: Any) -> None:
        time.sleep(0.2)  # both members have looked before either makes a folder
        real_mkdir(path, *args, **kwargs)

    try:
        os.setgroups([gid])
        os.setgid(gid)
        os.setuid(uid)
        os.umask(0o027)
        os.mkdir = slow_mkdir  # type: ignore[assignment]
        barrier.wait(10)
        home = _perms.make_member_home(lab, Permissions("group", GROUP, 0o027))
        errors.put((uid, "" if os.stat(home).st_uid == uid else f"{home} is not mine"))
    except BaseException as err:  # noqa: BLE001 - reported to the test, whatever it is
        errors.put((uid, f"{type(err).__name__}: {err}"))


def test_two_members_making_the_lab_folder_at_once_both_succeed(shared_tmp: Path) -> None:
    gid = grp.getgrnam(GROUP).gr_gid
    lab = shared_tmp / "lab"
    ctx = multiprocessing.get_context("fork")
    barrier, errors = ctx.Barrier(len(MEMBERS)), ctx.Queue()
    procs = [ctx.Process(target=_member, args=(u, gid, lab, barrier, errors)) for u in MEMBERS]
    for p in procs:
        p.start()
    results = dict(errors.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(10)
    assert results == {u: "" for u in MEMBERS}
    for folder in (lab, lab / _perms.MEMBERS_DIR):
        st = os.stat(folder)
        assert (stat.S_IMODE(st.st_mode), st.st_gid) == (_perms.LAB_DIR_MODE, gid), folder
    owners = {os.stat(lab / _perms.MEMBERS_DIR / _perms.user_name(u)).st_uid for u in MEMBERS}
    assert owners == set(MEMBERS)
