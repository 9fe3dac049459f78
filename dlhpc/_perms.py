"""Applying the site's permission policy (:mod:`dlhpc.config._permissions`).

The mechanism is the process umask, set once where a process learns its site
(:func:`apply_umask`: the CLI when it resolves the site, the in-job worker from
``trial.json``), so every file and folder created afterwards gets it without a
chmod at each call site. What a umask cannot do is done here, in one place:

* group mode: a folder dlhpc creates at the top of a tree (a member's state folder,
  an experiment's checkpoint folder, a report or export folder) is given to the lab
  group and made setgid (:func:`make_dirs`); folders created below it inherit both.
  The umask keeps every file and folder writable by its owner alone; the lab folder
  and its ``users/`` folder, where each member makes their own state folder
  (:func:`make_member_home`), are the only group-writable ones, and sticky;
* ``tempfile.mkstemp`` creates 0600 whatever the umask: :func:`fix_fd_mode`;
* ``shutil.copy2`` copies the source's mode: :func:`copy_file` masks it;
* the code snapshot is read-only (:func:`read_only_tree`), and a tree that holds one is
  removed with :func:`remove_tree`;
* the database is never world-writable (:func:`check_db_files`);
* "who am I" (:func:`current_user`) and "may I change this experiment"
  (:func:`check_may_modify`), so tests can fake the user at one boundary.

Standard library only (the worker imports it inside jobs).
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import shutil
import stat
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from dlhpc.errors import NotPermittedError, StoreError

if TYPE_CHECKING:
    from dlhpc.config._permissions import Permissions

__all__ = [
    "DB_SIDE_FILES",
    "MEMBERS_DIR",
    "apply_umask",
    "check_db_files",
    "check_may_modify",
    "copy_file",
    "current_umask",
    "current_user",
    "fix_fd_mode",
    "make_dirs",
    "make_member_home",
    "member_home",
    "read_only_tree",
    "remove_tree",
    "may_modify",
    "umask_mode",
    "user_name",
]

DB_SIDE_FILES = ("", "-wal", "-shm", "-journal")  # suffixes of SQLite's files for one DB
MEMBERS_DIR = "users"  # group mode: <lab folder>/users/<user>/ is each member's state folder
LAB_DIR_MODE = 0o3770  # the lab folder and users/: setgid, sticky, the group may add entries
LAB_DIR_WAIT_S = 10.0  # how long a member waits for another's new lab folder to be shared


def current_umask() -> int:
    """The process umask, read without changing it (Linux ``/proc``; else set and restore)."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status", "rb") as f:
        for line in f:
            if line.startswith(b"Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o077)  # the brief window is the most private mask, never a wider one
    os.umask(mask)
    return mask


def apply_umask(umask: int) -> int:
    """Set the process umask; returns the previous one."""
    return os.umask(umask)


def current_user() -> str:
    """The name of the effective user (from the user database, not ``$USER``): what
    dlhpc records as an experiment's owner. A uid with no name gives its number."""
    return user_name(os.geteuid())


def user_name(uid: int) -> str:
    """The name of ``uid`` in the user database, else the number as text."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def fix_fd_mode(fd: int) -> None:
    """Give a file made by ``tempfile.mkstemp`` (always 0600) the umask's mode (0666 & ~umask)."""
    os.fchmod(fd, 0o666 & ~current_umask())


def umask_mode(path: Path) -> None:
    """Give a file we just created the mode a plain ``open`` gives (0666 & ~umask), not
    the 0644 & ~umask SQLite gives its database. Someone else's file (another process
    won the race) is left as it is."""
    with contextlib.suppress(PermissionError):
        os.chmod(path, 0o666 & ~current_umask())


def copy_file(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> str:
    """``shutil.copy2`` with the mode masked by the umask (usable as a ``copy_function``)."""
    out = shutil.copy2(src, dst)
    if not os.path.islink(out):
        os.chmod(out, stat.S_IMODE(os.lstat(src).st_mode) & ~current_umask())
    return str(out)


def read_only_tree(root: Path) -> None:
    """Take every write bit off ``root``, its folders and regular files (what a trial
    must not change: the code snapshot); symlinks are left alone. Files and folders of
    another user (a lab's group mode) are left as they are."""
    for dirpath, _dirnames, filenames in os.walk(root, topdown=False):
        for path in [*(os.path.join(dirpath, f) for f in filenames), dirpath]:
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode) or not st.st_mode & 0o222:
                continue
            with contextlib.suppress(PermissionError):
                os.chmod(path, stat.S_IMODE(st.st_mode) & ~0o222)


def remove_tree(root: Path, ignore_errors: bool = False) -> None:
    """``shutil.rmtree`` of a tree that may hold read-only folders (a code snapshot):
    the owner's write bit is put back on each of its folders first."""
    for dirpath, _dirnames, _filenames in os.walk(root):
        with contextlib.suppress(OSError):
            mode = stat.S_IMODE(os.lstat(dirpath).st_mode)
            if not mode & stat.S_IWUSR:
                os.chmod(dirpath, mode | stat.S_IWUSR | stat.S_IXUSR)
    shutil.rmtree(root, ignore_errors=ignore_errors)


def _group_id(group: str) -> int:
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise StoreError(f"permissions.group: no unix group {group!r} on this machine") from None


def share_dir(path: Path, policy: Permissions | None) -> None:
    """Group mode: give the folder ``path`` (ours) to the lab group and make it setgid."""
    if policy is None or policy.mode != "group" or policy.group is None:
        return
    gid = _group_id(policy.group)
    st = os.stat(path)
    try:
        if st.st_gid != gid:
            os.chown(path, -1, gid)
        os.chmod(path, (stat.S_IMODE(st.st_mode) | stat.S_ISGID) & ~(policy.umask & 0o777))
    except PermissionError as err:
        raise StoreError(
            f"cannot give {path} to group {policy.group!r}: {err.strerror}"
            f" (are you a member? see `id`)"
        ) from err


def make_dirs(path: Path, policy: Permissions | None) -> Path:
    """``mkdir -p path``; in group mode every folder created here is shared (setgid, lab
    group). Existing folders, and folders another process creates meanwhile, are left
    as they are. Returns ``path``."""
    _make_missing(path, policy)
    return path


def _make_missing(path: Path, policy: Permissions | None) -> list[Path]:
    """The folders of ``mkdir -p path`` this call created, each by its own ``mkdir``
    (so one that another process made first is known to be theirs, never changed
    here) and shared in group mode (:func:`share_dir`)."""
    missing: list[Path] = []
    p = path
    while not os.path.lexists(p) and p != p.parent:
        missing.append(p)
        p = p.parent
    made = []
    for folder in reversed(missing):
        try:
            os.mkdir(folder)
        except FileExistsError:
            continue
        share_dir(folder, policy)
        made.append(folder)
    path.mkdir(exist_ok=True)  # raises when it is not a folder
    return made


def member_home(lab: Path, policy: Permissions | None) -> Path:
    """The current user's state folder: ``lab`` itself, or in group mode
    ``lab/users/<user>`` (each member's database and run folders, theirs alone)."""
    if policy is None or policy.mode != "group":
        return lab
    return lab / MEMBERS_DIR / current_user()


def make_member_home(lab: Path, policy: Permissions | None) -> Path:
    """Create :func:`member_home` and return it. In group mode the lab folder and its
    ``users/`` folder, when this call creates them, are the lab group's, mode 3770
    (members add their own folder; the sticky bit keeps anyone from removing or renaming
    another's); the member's folder is shared for reading only (the umask's mode), and
    one made by someone else is refused (:class:`~dlhpc.errors.StoreError`). Members
    may start at once: one whose ``mkdir`` of the lab folder (or ``users/``) finds it
    made meanwhile waits, at most :data:`LAB_DIR_WAIT_S`, until its maker has given it
    to the group (:func:`_await_lab_dir`), and changes nothing of it."""
    home = member_home(lab, policy)
    if home == lab:
        return make_dirs(lab, policy)
    for folder in (lab, lab / MEMBERS_DIR):
        if os.path.lexists(folder):
            continue
        if folder in _make_missing(folder, policy):
            _open_to_group(folder)
        else:  # another member made it first: theirs to share; ready once they have
            _await_lab_dir(folder, policy)
    make_dirs(home, policy)
    owner = os.stat(home).st_uid
    if owner != os.geteuid():  # another member made it first: nothing of it may be trusted
        raise StoreError(
            f"{home} belongs to {user_name(owner)}, not to you ({current_user()}): ask them"
            " to remove it, or the lab's admin to give it to you"
        )
    return home


def _await_lab_dir(folder: Path, policy: Permissions | None) -> None:
    """Wait until ``folder``, which another process has just made, is a folder of the
    lab's group with mode :data:`LAB_DIR_MODE`, at most :data:`LAB_DIR_WAIT_S`; else
    :class:`~dlhpc.errors.StoreError` saying what it is."""
    if policy is None or policy.group is None:
        raise StoreError(f"{folder}: a lab folder needs the site's permissions.group")
    gid = _group_id(policy.group)
    deadline = time.monotonic() + LAB_DIR_WAIT_S
    while True:
        st = os.lstat(folder)
        ready = stat.S_ISDIR(st.st_mode) and st.st_gid == gid
        if ready and stat.S_IMODE(st.st_mode) == LAB_DIR_MODE:
            return
        if time.monotonic() >= deadline:
            raise StoreError(
                f"{folder}, made by {user_name(st.st_uid)} meanwhile, is not a folder of group"
                f" {policy.group!r} with mode {LAB_DIR_MODE:04o} (it is"
                f" {stat.S_IMODE(st.st_mode):04o}, group {st.st_gid}): ask them, or the lab's"
                " admin, to fix it"
            )
        time.sleep(0.01)


def _open_to_group(folder: Path) -> None:
    try:
        os.chmod(folder, LAB_DIR_MODE)
    except PermissionError as err:  # another member created it meanwhile: theirs to set
        if os.stat(folder).st_uid == os.geteuid():
            raise StoreError(f"cannot open {folder} to the lab group: {err.strerror}") from err


def check_db_files(db_path: Path) -> list[str]:
    """Refuse a world-writable database; repair our own file's mode.

    For the DB and its ``-wal``/``-shm``/``-journal`` files: one that is ours and
    world-writable loses ``o+w`` (the returned lines say so); one that is someone
    else's raises :class:`~dlhpc.errors.StoreError` (anyone could corrupt it).
    """
    notes = []
    for suffix in DB_SIDE_FILES:
        f = Path(f"{db_path}{suffix}")
        try:
            st = os.stat(f)
        except FileNotFoundError:
            continue
        if not st.st_mode & stat.S_IWOTH:
            continue
        mode = stat.S_IMODE(st.st_mode)
        if st.st_uid != os.geteuid():
            owner = user_name(st.st_uid)
            owner = f"uid {owner}" if owner.isdigit() else owner
            raise StoreError(
                f"{f} is world-writable (mode {mode:04o}) and belongs to {owner}; refusing to"
                f" use it: ask {owner} to run `chmod o-w {f}`"
            )
        os.chmod(f, mode & ~0o002)
        notes.append(f"{f} was world-writable (mode {mode:04o}); now {mode & ~0o002:04o}")
    return notes


def warn(lines: list[str]) -> None:
    for line in lines:
        print(f"dlhpc: warning: {line}", file=sys.stderr)


def may_modify(owner: str, policy: Permissions | None) -> bool:
    """May the current user change an experiment of ``owner`` ("" = not recorded)?"""
    if not owner or owner == current_user():
        return True
    return policy is not None and policy.others_experiments == "write"


def check_may_modify(owner: str, what: str, policy: Permissions | None) -> None:
    """Raise :class:`~dlhpc.errors.NotPermittedError` unless :func:`may_modify`."""
    if not may_modify(owner, policy):
        raise NotPermittedError(
            f"{what} belongs to {owner}; you ({current_user()}) may only read it"
            " (the site's permissions.others_experiments is 'read')"
        )
