"""Publishing the pages under a web-served folder (``dlhpc report --all --publish``).

A web server (``~/public_html``, a lab's shared web folder) runs as another user, so
it must be able to read the pages and pass through every folder above them. With
``--publish`` the report folder and the pages are made readable by others (files
``o+r``, folders ``o+rx``; nothing becomes writable by anyone new), while the state
folder (``DLHPC_HOME``: the database, run folders, logs) keeps the site's policy.

Checked before anything is written (:func:`check_publishable`, a
:class:`~dlhpc.errors.UsageError`, exit 2):

* the folder is not inside the state folder (publishing it would expose the state
  folder's listing path to others, and a web server would need to traverse it);
* every existing folder above it can be traversed by others (``o+x``): otherwise the
  web server cannot reach the pages, and the message names the folder and the
  ``chmod o+x`` that fixes it (dlhpc never widens a folder it did not create).
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

from dlhpc._perms import apply_umask, current_umask
from dlhpc.errors import DlhpcError, UsageError

__all__ = ["check_publishable", "make_public", "publish_umask", "publishing"]

_READ = stat.S_IRGRP | stat.S_IROTH  # what a published file gains
_PASS = _READ | stat.S_IXGRP | stat.S_IXOTH  # ... and a published folder


def _inside(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
    except ValueError:
        return False
    return True


def check_publishable(out_dir: Path, state_dir: Path) -> None:
    """Refuse (:class:`~dlhpc.errors.UsageError`) an ``out_dir`` a web server could not
    serve, or one inside ``state_dir`` (see the module doc)."""
    out = out_dir.expanduser().absolute()
    real = Path(os.path.realpath(out))
    if _inside(real, Path(os.path.realpath(state_dir))):
        raise UsageError(
            f"--publish: {out} is inside the state folder {state_dir}, which stays private;"
            " publish to a folder outside it (e.g. --out-dir ~/public_html/dlhpc)"
        )
    closed = []
    for folder in reversed([real, *real.parents]):
        try:
            st = os.stat(folder)
        except FileNotFoundError:
            break  # this one and those below are created by the report, traversable
        if not st.st_mode & stat.S_IXOTH:
            closed.append(folder)
    if closed:
        lines = [
            f"  {f} (mode {stat.S_IMODE(os.stat(f).st_mode):04o}): chmod o+x {f}" for f in closed
        ]
        raise UsageError(
            f"--publish: a web server (another user) cannot reach {out}: these folders do"
            " not let others pass through (o+x lets them pass, not list):\n"
            + "\n".join(lines)
            + "\nnothing was written"
        )


def publish_umask(umask: int) -> int:
    """``umask`` less the group and other read and search bits: what a published file
    or folder is created with (write bits stay masked)."""
    return umask & ~0o055


@contextlib.contextmanager
def publishing() -> Iterator[None]:
    """The process umask as :func:`publish_umask` of the current one, restored after."""
    before = apply_umask(publish_umask(current_umask()))
    try:
        yield
    finally:
        apply_umask(before)


def make_public(folders: Iterable[Path], files: Iterable[Path]) -> None:
    """Give each of ``folders`` ``g+rx,o+rx`` and each of ``files`` ``g+r,o+r`` (the
    pages kept from an earlier, unpublished run included)."""
    for path, extra in (*((d, _PASS) for d in folders), *((f, _READ) for f in files)):
        try:
            mode = stat.S_IMODE(os.stat(path).st_mode)
            if mode & extra != extra:
                os.chmod(path, mode | extra)
        except OSError as err:
            raise DlhpcError(f"--publish: cannot make {path} readable: {err.strerror}") from err
