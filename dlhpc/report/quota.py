"""The scratch quota, where the site exposes it: ``lfs quota`` on Lustre.

:func:`lustre_quota` asks ``lfs quota -u $USER <dir>`` when ``<dir>`` (or its
nearest existing parent) is on Lustre and ``lfs`` is on PATH; anywhere else, or
when the answer does not parse or sets no limit, it returns None (nothing to warn
about). :func:`quota_warning` turns usage at or above :data:`WARN_FRACTION` of the
limit into one line for ``dlhpc status`` and ``dlhpc doctor``. Only the user's
block quota is read (not group or project quotas, not inodes).
"""

from __future__ import annotations

import getpass
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["WARN_FRACTION", "Quota", "lustre_quota", "parse_lfs_quota", "quota_warning"]

WARN_FRACTION = 0.9
_UNITS = {"": 1024, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4, "p": 1024**5}
_SIZE_RE = re.compile(r"^(?P<num>\d+(?:\.\d+)?)(?P<unit>[kKmMgGtTpP]?)\*?$")


@dataclass(frozen=True)
class Quota:
    filesystem: str
    used_bytes: int
    limit_bytes: int  # the soft quota when one is set, else the hard limit
    hard: bool  # limit_bytes is the hard limit

    @property
    def fraction(self) -> float:
        return self.used_bytes / self.limit_bytes


def _size(token: str) -> int | None:
    """``lfs quota`` sizes: KiB without a unit (``30720``, ``30720*`` when over the
    quota); with ``-h``, a number and a unit (``1.5G``)."""
    m = _SIZE_RE.match(token)
    if m is None:
        return None
    return int(float(m["num"]) * _UNITS[m["unit"].lower()])


def parse_lfs_quota(text: str) -> Quota | None:
    """The block usage and limit in ``lfs quota -u USER DIR`` output, else None.

    The row after the ``Filesystem kbytes quota limit grace ...`` header; a long
    filesystem name sits on a line of its own, its numbers on the next one.
    """
    lines = text.splitlines()
    start = next(
        (i + 1 for i, line in enumerate(lines) if line.split()[:1] == ["Filesystem"]), None
    )
    if start is None:
        return None
    tokens: list[str] = []
    for line in lines[start:]:
        tokens += line.split()
        if len(tokens) >= 4:
            break
    if len(tokens) < 4:
        return None
    used, soft, hard = (_size(t) for t in tokens[1:4])
    if used is None or soft is None or hard is None:
        return None
    if soft == 0 and hard == 0:
        return None  # no limit
    return Quota(tokens[0], used, soft or hard, hard=soft == 0)


def _fs_type(path: Path) -> str:
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        out = subprocess.run(
            ["stat", "-f", "-c", "%T", str(p)], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


def lustre_quota(path: Path, user: str | None = None) -> Quota | None:
    """The user's block quota on the Lustre filesystem holding ``path``, or None."""
    if _fs_type(path) != "lustre" or shutil.which("lfs") is None:
        return None
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        out = subprocess.run(
            ["lfs", "quota", "-u", user or getpass.getuser(), str(p)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_lfs_quota(out.stdout) if out.returncode == 0 else None


def _gib(n: int) -> str:
    return f"{n / 1024**3:.1f} GiB"


def quota_warning(path: Path, quota: Quota | None = None) -> str | None:
    """One line when usage is at or above :data:`WARN_FRACTION` of the limit, else None.
    ``quota`` defaults to :func:`lustre_quota` of ``path``."""
    q = quota if quota is not None else lustre_quota(path)
    if q is None or q.fraction < WARN_FRACTION:
        return None
    kind = "hard limit" if q.hard else "quota"
    return (
        f"scratch quota: {_gib(q.used_bytes)} of {_gib(q.limit_bytes)} {kind} used "
        f"({q.fraction:.0%}) on {q.filesystem} (checkpoints under {path}); "
        "lower checkpoint.keep_* or run `dlhpc gc`"
    )
