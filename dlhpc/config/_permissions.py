"""The ``permissions:`` section of a site file: who may read what dlhpc creates.

::

    permissions:
      mode: private            # private (default) | group
      group: mylab             # group mode: the unix group that shares the lab folders
      umask: "027"             # optional, quoted octal; default 077 (private), 027 (group)
      others_experiments: read # read (default) | write (private mode only)

Contract: the returned :class:`Permissions` always has a umask that masks
world-write (``0o002``), so the DB and the state folders are never world-writable;
in group mode it masks group-write and every world bit (``0o027``): each member's
files are that member's alone to change, the lab reads them; ``group`` names a unix
group that exists on this machine, and ``others_experiments`` is ``read`` (a member
cannot write another's database or folders). Applying the policy is :mod:`dlhpc._perms`' job;
loading has no side effects.
"""

from __future__ import annotations

import grp
import re
from dataclasses import dataclass
from typing import Any, Literal

from dlhpc.config._validate import Field, Invalid, Issues, choice, describe, read_section, string

__all__ = ["PRIVATE_UMASK", "GROUP_UMASK", "Permissions", "read_permissions"]

PRIVATE_UMASK = 0o077
GROUP_UMASK = 0o027
_OCTAL = re.compile(r"(?:0o)?[0-7]{3,4}")
_GROUP = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}\$?")


@dataclass(frozen=True)
class Permissions:
    """A site's permission policy (see the module docstring)."""

    mode: Literal["private", "group"] = "private"
    group: str | None = None  # group mode: folders are group-owned by it and setgid
    umask: int = PRIVATE_UMASK
    others_experiments: Literal["read", "write"] = "read"

    def describe(self) -> str:
        shared = f" (group {self.group})" if self.group else ""
        others = self.others_experiments
        return f"{self.mode}{shared}, umask {self.umask:03o}, others' experiments: {others}"


def _umask(value: Any) -> int:
    if not isinstance(value, str) or not _OCTAL.fullmatch(value.strip()):
        raise Invalid(f"must be a quoted octal umask like '077' or '027', got {describe(value)}")
    return int(value.strip().removeprefix("0o"), 8)


_FIELDS = {
    "mode": Field(choice("private", "group"), default="private"),
    "group": Field(string(pattern=_GROUP, what="must be a unix group name"), nullable=True),
    "umask": Field(_umask, nullable=True),
    "others_experiments": Field(choice("read", "write"), default="read"),
}


def read_permissions(issues: Issues, value: Any) -> Permissions:
    """Validate the site's ``permissions`` mapping; problems go to ``issues``."""
    here = ("permissions",)
    s = read_section(issues, value, here, _FIELDS)
    mode, group, umask = s["mode"], s["group"], s["umask"]
    if mode == "group" and group is None and issues.ok((*here, "group")):
        issues.add((*here, "mode"), "mode: group needs 'group: <unix group>' (the lab's group)")
    if mode == "private" and group is not None:
        issues.add((*here, "group"), "only used with 'mode: group'; remove it or set the mode")
    if group is not None and issues.ok((*here, "group")):
        try:
            grp.getgrnam(group)
        except KeyError:
            issues.add(
                (*here, "group"), f"no unix group {group!r} on this machine (see getent group)"
            )
    if umask is None:
        umask = GROUP_UMASK if mode == "group" else PRIVATE_UMASK
    elif umask & 0o002 == 0:
        issues.add((*here, "umask"), f"{umask:03o} lets everyone write; it must mask o+w (002)")
    elif mode == "group" and umask & 0o027 != 0o027:
        issues.add(
            (*here, "umask"),
            f"{umask:03o} lets the group write or others read; group mode needs x27 (e.g. 027)",
        )
    others = s["others_experiments"]
    if mode == "group" and others == "write":
        issues.add(
            (*here, "others_experiments"),
            "group mode keeps each member's state writable by that member alone; use 'read'",
        )
    return Permissions(mode, group, umask, others)
