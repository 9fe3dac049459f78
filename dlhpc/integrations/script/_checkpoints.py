"""The script's checkpoint folder, watched: complete entries become dlhpc checkpoints.

The script writes its checkpoints into its folder (``{checkpoint_dir}``, the
trial's checkpoint folder's ``script/``), one *entry* per checkpoint: a file or a
folder directly in it. An entry is **complete** when its name carries no
in-progress mark (a leading ``.``, or a trailing ``.tmp``, ``.part``, ``.partial`` or
``~``) and either

* it did not change (the inode, size and modification time of it and of every
  file in it) between two looks of the runner at least a second apart while the
  script ran (:meth:`ScriptCheckpoints.stable`), or
* the script exited 0 (:meth:`ScriptCheckpoints.changed`: every entry then).

Writing under a temporary name and renaming it into place (``os.replace``) is the
safe way; the two-look rule covers scripts that write in place, but cannot tell a
write that paused for over a second from a finished one. Entries present when
the runner starts are those of earlier attempts: known, not registered again
unless they change.

A complete entry is *registered* (:meth:`ScriptCheckpoints.publish`): copied into
a dlhpc checkpoint (``ckpt-<step>``, :func:`~dlhpc.protocol.checkpoint.publish_checkpoint`:
hashed, manifest last), with its name in the manifest's metadata
(``script_entry``). A copy, not a link: a script that rewrites ``last.pt`` in place
cannot corrupt a registered checkpoint. Its step is the last number in the
entry's name (``epoch-12.pt``: 12), else the newest step the script reported.
:func:`resume_path` is what ``{checkpoint}`` gets: the entry inside the newest
verified checkpoint, or ``""``.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from dlhpc.protocol.checkpoint import Checkpoint, latest_verified, publish_checkpoint

__all__ = ["SCRIPT_ENTRY_KEY", "SCRIPT_SUBDIR", "ScriptCheckpoints", "resume_path", "step_of"]

SCRIPT_SUBDIR = "script"
SCRIPT_ENTRY_KEY = "script_entry"
_IN_PROGRESS_SUFFIXES = (".tmp", ".part", ".partial", "~")
_LAST_NUMBER = re.compile(r"(\d+)(?!.*\d)")

Fingerprint = tuple[tuple[str, int, int, int], ...]


def step_of(name: str, fallback: int) -> int:
    """The last number in ``name`` (``epoch-12.pt`` -> 12), else ``fallback``."""
    m = _LAST_NUMBER.search(name)
    return int(m[1]) if m else fallback


def _in_progress(name: str) -> bool:
    return name.startswith(".") or name.endswith(_IN_PROGRESS_SUFFIXES)


def _fingerprint(path: Path) -> Fingerprint | None:
    """(relative name, inode, size, mtime_ns) of the entry and each file below it;
    None when it vanished or holds no file (a folder being filled)."""
    try:
        st = os.lstat(path)
        rows = [("", st.st_ino, st.st_size, st.st_mtime_ns)]
        if path.is_dir() and not path.is_symlink():
            files = 0
            for dirpath, _dirs, names in os.walk(path):
                for name in names:
                    p = os.path.join(dirpath, name)
                    s = os.lstat(p)
                    rows.append((os.path.relpath(p, path), s.st_ino, s.st_size, s.st_mtime_ns))
                    files += 1
            if files == 0:
                return None
    except OSError:
        return None
    return tuple(sorted(rows))


class ScriptCheckpoints:
    """Which entries of the script's folder are complete, and their registration."""

    def __init__(self, script_dir: Path, root: Path) -> None:
        self.script_dir = script_dir
        self.root = root
        script_dir.mkdir(parents=True, exist_ok=True)
        self._seen = self._look()  # the previous look
        self._registered: dict[str, Fingerprint] = dict(self._seen)  # earlier attempts'

    def _look(self) -> dict[str, Fingerprint]:
        out = {}
        for name in sorted(os.listdir(self.script_dir)):
            if not _in_progress(name):
                fp = _fingerprint(self.script_dir / name)
                if fp is not None:
                    out[name] = fp
        return out

    def _new(self, current: dict[str, Fingerprint], names: list[str]) -> list[str]:
        fresh = [n for n in names if self._registered.get(n) != current[n]]

        def mtime(n: str) -> int:
            return max(row[3] for row in current[n])

        return sorted(fresh, key=lambda n: (mtime(n), n))  # oldest first: newest ends last

    def stable(self) -> list[str]:
        """A look: the unregistered entries unchanged since the previous look, oldest first.
        Call it about once a second while the script runs."""
        current = self._look()
        same = [n for n, fp in current.items() if self._seen.get(n) == fp]
        self._seen = current
        return self._new(current, same)

    def changed(self) -> list[str]:
        """Every unregistered entry as it is now (after the script exited 0), oldest first."""
        current = self._look()
        self._seen = current
        return self._new(current, list(current))

    def publish(self, name: str, step: int) -> Checkpoint:
        """Copy entry ``name`` into a new dlhpc checkpoint of ``step``; OSError/ValueError
        when it vanished or changed meanwhile (nothing is published then)."""
        src = self.script_dir / name
        before = _fingerprint(src)

        def write(tmp: Path) -> None:
            if src.is_dir():
                shutil.copytree(src, tmp / name, symlinks=False)
            else:
                shutil.copy2(src, tmp / name)
            if _fingerprint(src) != before:
                raise ValueError(f"{src} changed while dlhpc copied it")

        ckpt = publish_checkpoint(self.root, step, write, metadata={SCRIPT_ENTRY_KEY: name})
        if before is not None:
            self._registered[name] = before
        return ckpt


def resume_path(root: Path) -> str:
    """``{checkpoint}``: the newest verified checkpoint's entry (or folder), or ``""``."""
    ckpt, _torn = latest_verified(root)
    if ckpt is None:
        return ""
    entry = ckpt.metadata.get(SCRIPT_ENTRY_KEY)
    if isinstance(entry, str) and entry and "/" not in entry and entry not in (".", ".."):
        return str(ckpt.path / entry)
    return str(ckpt.path)
