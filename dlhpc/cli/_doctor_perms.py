"""``dlhpc doctor``'s permission checks: the site's policy, and whether the state
folders, the database and the run folders follow it.

In group mode (docs/SECURITY.md, "Group mode") the lab folder and its ``users/``
folder are the lab group's, setgid and sticky; everything in a member's state folder
(``users/<user>/``: the database, the run folders with ``entry.sh``, ``trial.json``,
``experiment.json``, the code snapshot, the trial and attempt folders) is writable by
that member alone and readable by the group; each member's database is readable by
the others (the lab view). A file the group may write is a failure: any member could
run code as its owner or change their state. The run folders are walked up to
:data:`WALK_LIMIT` entries (the newest experiments first).
"""

from __future__ import annotations

import grp
import os
import stat
from pathlib import Path

from dlhpc._perms import DB_SIDE_FILES, MEMBERS_DIR, current_user, member_home, user_name
from dlhpc.config import Permissions
from dlhpc.config.schema import SiteConfig
from dlhpc.scheduler.plugins import Check
from dlhpc.store import default_home, lab_databases
from dlhpc.store.store import DB_NAME

__all__ = ["WALK_LIMIT", "permission_checks"]

WALK_LIMIT = 20_000  # run-folder entries looked at by one doctor


def permission_checks(site: SiteConfig) -> list[Check]:
    """The site's permission policy, and whether the folders and the DB follow it."""
    policy = site.permissions
    checks = [Check("permission policy", "ok", policy.describe())]
    lab = default_home(site.state_dir)
    home = member_home(lab, policy)
    if policy.group is not None:
        checks.append(_group_member_check(policy.group))
        checks += [_lab_dir_check(p, policy.group) for p in (lab, lab / MEMBERS_DIR)]
    for path in (home, *(Path(f"{home / DB_NAME}{s}") for s in DB_SIDE_FILES)):
        try:
            st = path.stat()
        except OSError:
            continue
        checks.append(_mode_check(path, st, policy))
    checks.append(_runs_check(home / "runs", policy))
    if policy.mode == "group":
        checks.append(_lab_view_check(lab))
    return checks


def _group_member_check(group: str) -> Check:
    try:
        members = grp.getgrnam(group)
        mine = members.gr_gid in os.getgroups() or current_user() in members.gr_mem
    except KeyError:
        mine = False
    detail = f"you ({current_user()}) are {'' if mine else 'not '}in group {group}"
    return Check("lab group", "ok" if mine else "fail", detail)


def _lab_dir_check(path: Path, group: str) -> Check:
    """The lab folder or ``users/``: the group's, setgid, sticky, nothing for others."""
    label = f"lab folder {path.name}/"
    try:
        st = path.stat()
    except OSError:
        return Check(label, "skip", f"{path} does not exist yet (the first launch makes it)")
    mode = stat.S_IMODE(st.st_mode)
    want = stat.S_ISGID | stat.S_ISVTX | 0o070
    if mode & 0o007 or mode & want != want or st.st_gid != grp.getgrnam(group).gr_gid:
        fix = f"chgrp {group} {path} && chmod 3770 {path}"
        return Check(label, "fail", f"{path} ({mode:04o}) is not the lab's 3770: {fix}")
    return Check(label, "ok", f"{path} ({mode:04o}, group {group}, sticky)")


def _mode_check(path: Path, st: os.stat_result, policy: Permissions) -> Check:
    mode = stat.S_IMODE(st.st_mode)
    label = "state folder mode" if path.is_dir() else f"{path.name} mode"
    if mode & stat.S_IWOTH and not (path.is_dir() and mode & stat.S_ISVTX):
        return Check(label, "fail", f"{path} is world-writable ({mode:04o}): chmod o-w {path}")
    if policy.mode == "group" and mode & stat.S_IWGRP:
        return Check(label, "fail", f"{path} ({mode:04o}) is writable by the group: chmod g-w")
    if st.st_uid != os.geteuid():
        return Check(label, "fail", f"{path} belongs to {user_name(st.st_uid)}, not to you")
    if policy.mode == "group" and policy.group is not None and path.is_dir():
        gid = grp.getgrnam(policy.group).gr_gid
        if st.st_gid != gid or not mode & stat.S_ISGID:
            fix = f"chgrp {policy.group} {path} && chmod g+rxs {path}"
            return Check(label, "warn", f"{path} ({mode:04o}) is not shared with the group: {fix}")
    if mode & 0o007 or (policy.mode == "private" and mode & 0o070):
        who = "others" if mode & 0o007 else "your group"
        detail = f"{path} ({mode:04o}) is readable by {who}; the policy is {policy.mode}"
        return Check(label, "warn", detail)
    return Check(label, "ok", f"{path} ({mode:04o})")


def _runs_check(runs: Path, policy: Permissions) -> Check:
    """No entry of the run folders (symlinks aside) may be written by the group (group
    mode) or by others, nor belong to someone else."""
    label = "run folders"
    if not runs.is_dir():
        return Check(label, "skip", f"{runs} does not exist yet")
    loose = 0o022 if policy.mode == "group" else 0o002
    bad: list[str] = []
    seen, me = 0, os.geteuid()
    for dirpath, dirnames, filenames in os.walk(runs):  # symlinked folders: not entered
        dirnames.sort(reverse=True)  # exp-000042-... before exp-000001-...
        for path in (dirpath, *(os.path.join(dirpath, f) for f in filenames)):
            seen += 1
            st = os.lstat(path)
            if not stat.S_ISLNK(st.st_mode) and (st.st_mode & loose or st.st_uid != me):
                bad.append(f"{path} ({stat.filemode(st.st_mode)}, {user_name(st.st_uid)})")
        if seen >= WALK_LIMIT:
            break
    who = "the group or others" if policy.mode == "group" else "others"
    if bad:
        more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
        detail = f"writable by {who} or not yours: {'; '.join(bad[:3])}{more}: chmod -R g-w,o-w"
        return Check(label, "fail", detail)
    return Check(label, "ok", f"{seen} entries of {runs}: writable by you alone")


def _lab_view_check(lab: Path) -> Check:
    """Every member's database readable (the lab view, ``report --all``)."""
    found = lab_databases(lab)
    unreadable = [name for name, db in found if not os.access(db, os.R_OK)]
    if unreadable:
        detail = f"you cannot read the database of {', '.join(unreadable)}: they run chmod g+r"
        return Check("lab view", "warn", detail)
    names = ", ".join(name for name, _ in found) or "none yet"
    return Check("lab view", "ok", f"{len(found)} member database(s) readable: {names}")
