"""File helpers of the record: sha256, ``.gitignore`` filtering, data fingerprints.

Standard library at import (the job side imports :func:`fingerprint_data`). Contracts:

* :func:`code_files` lists a workdir's code, the one list that the code snapshot
  copies and the record's manifest hashes: what ``.gitignore`` rules keep, as git
  applies them (git itself in a work tree, else :mod:`pathspec`, imported only then).
* :func:`fingerprint_data` describes declared data inputs: file list, sizes,
  mtimes, a digest of that listing, and a content digest when asked; it never
  raises for a missing or unreadable path (it says so in the entry).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathspec import GitIgnoreSpec

__all__ = ["LISTING_LIMIT", "SKIP_DIRS", "code_files", "file_sha256", "fingerprint_data"]

SKIP_DIRS = (".git", ".hg", ".svn", "__pycache__", ".venv", "venv", ".mypy_cache", ".pytest_cache")
LISTING_LIMIT = 1000  # files listed per data input in the record (the digests cover all)
_CHUNK = 1 << 20


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def skip_pathspecs() -> list[str]:
    """git pathspecs that leave out VCS, virtualenv and cache folders."""
    return ["--", ".", *(f":(exclude,glob)**/{d}/**" for d in SKIP_DIRS)]


def _skipped(rel: str) -> bool:
    return any(part in SKIP_DIRS for part in rel.split("/")) or rel.endswith(".pyc")


def _in_git_work_tree(root: Path) -> bool:
    if shutil.which("git") is None:
        return False
    try:
        proc = subprocess.run(
            ["git", "rev-parse", "--is-inside-work-tree"], cwd=root, env=_git_env(),
            capture_output=True, timeout=15, check=False, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except subprocess.TimeoutExpired as err:
        raise OSError(f"git rev-parse in {root}: {err}") from None
    return proc.returncode == 0 and proc.stdout.strip() == b"true"


def _git_env() -> dict[str, str]:
    return {**os.environ, "GIT_OPTIONAL_LOCKS": "0", "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}


def _git_files(root: Path) -> list[str]:
    """Tracked files (submodules' included: research code often vendors one) and the
    untracked files no ``.gitignore`` rule excludes; git cannot list both at once."""
    rels: list[str] = []
    for which in (["--cached", "--recurse-submodules"], ["--others", "--exclude-standard"]):
        try:
            proc = subprocess.run(
                ["git", "ls-files", *which, "-z", *skip_pathspecs()],
                cwd=root, env=_git_env(), capture_output=True, timeout=60, check=False,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as err:
            raise OSError(f"git ls-files in {root}: {err}") from None
        if proc.returncode != 0:
            why = proc.stderr.decode(errors="replace").strip().splitlines()
            raise OSError(f"git ls-files in {root}: {why[-1] if why else proc.returncode}")
        rels += [r for r in proc.stdout.decode(errors="replace").split("\0") if r]
    return rels


def _ignored(rel: str, levels: list[tuple[str, GitIgnoreSpec]]) -> bool:
    """Whether ``rel`` (a folder's ends with ``/``) is ignored: as git, the deepest
    ``.gitignore`` with a matching pattern decides, its last matching pattern wins."""
    for base, spec in reversed(levels):
        if base and not rel.startswith(base):
            continue
        include = spec.check_file(rel[len(base) :]).include
        if include is not None:
            return include
    return False


def _pathspec_files(root: Path, skip: Path | None) -> list[str]:
    from pathspec import GitIgnoreSpec  # only for a workdir outside git

    out: list[str] = []
    levels: dict[str, list[tuple[str, GitIgnoreSpec]]] = {"": []}
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        rel_dir = here.relative_to(root).as_posix()
        prefix = "" if rel_dir == "." else rel_dir + "/"
        rules = list(levels.pop(prefix))
        if ".gitignore" in filenames:
            text = (here / ".gitignore").read_text(encoding="utf-8", errors="replace")
            rules.append((prefix, GitIgnoreSpec.from_lines(text.splitlines())))
        # git does not look inside an ignored folder: nothing below it comes back
        dirnames[:] = sorted(
            d
            for d in dirnames
            if d not in SKIP_DIRS
            and not (here / d).is_symlink()
            and here / d != skip
            and not _ignored(f"{prefix}{d}/", rules)
        )
        levels.update({f"{prefix}{d}/": rules for d in dirnames})
        out.extend(prefix + f for f in filenames if not _ignored(prefix + f, rules))
    return out


def code_files(root: Path, skip: Path | None = None) -> tuple[list[str], str]:
    """The workdir's code: (sorted relative POSIX paths, which rules chose them).

    The one list that the code snapshot copies and the record's manifest hashes:
    the regular files (no symlinks) that ``.gitignore`` rules keep, as git applies
    them: ``git ls-files`` (tracked, submodules included, and untracked not
    ignored) in a git work tree,
    else every ``.gitignore`` below ``root`` read by :mod:`pathspec` (nested files,
    negations, folder patterns). VCS, virtualenv and cache folders, ``*.pyc`` and
    ``skip`` (the state folder, when it lies inside) are left out. Raises OSError
    when git fails in a work tree.
    """
    if _in_git_work_tree(root):
        rels, rules = _git_files(root), "git ls-files (tracked, submodules, untracked not ignored)"
    else:
        rels, rules = _pathspec_files(root, skip), "pathspec (.gitignore files; no git work tree)"
    out = []
    for rel in sorted(set(rels)):
        path = root / rel
        if _skipped(rel) or (skip is not None and (path == skip or skip in path.parents)):
            continue
        if path.is_file() and not path.is_symlink():
            out.append(rel)
    return out, rules


def _files_of(path: Path) -> list[tuple[str, Path]]:
    if path.is_file():
        return [(path.name, path)]
    out = []
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames.sort()
        here = Path(dirpath)
        for name in sorted(filenames):
            p = here / name
            out.append((p.relative_to(path).as_posix(), p))
    return out


def _fingerprint(path: Path, content: bool, listing_limit: int) -> dict[str, Any]:
    entry: dict[str, Any] = {"path": str(path), "hash": content}
    if not path.exists():
        entry["exists"] = False
        return entry
    entry.update(exists=True, kind="file" if path.is_file() else "dir")
    listing = hashlib.sha256()
    digest = hashlib.sha256()
    rows: list[list[Any]] = []
    total = count = 0
    for rel, p in _files_of(path):
        try:
            st = p.stat()
            sha = file_sha256(p) if content else None
        except OSError as err:
            entry.setdefault("unreadable", []).append(f"{rel}: {err.strerror}")
            continue
        count += 1
        total += st.st_size
        listing.update(f"{rel}\t{st.st_size}\t{st.st_mtime_ns}\n".encode())
        if sha is not None:
            digest.update(f"{rel}\t{sha}\n".encode())
        if len(rows) < listing_limit:
            rows.append([rel, st.st_size, st.st_mtime, *([sha] if sha else [])])
    entry.update(files=count, bytes=total, listing_sha256=listing.hexdigest())
    if content:
        entry["content_sha256"] = digest.hexdigest()
    entry["listing"] = rows
    entry["listing_truncated"] = count > len(rows)
    return entry


def fingerprint_data(
    inputs: Sequence[Mapping[str, Any]], listing_limit: int = LISTING_LIMIT
) -> list[dict[str, Any]]:
    """One fingerprint per ``{"path", "hash"}`` input::

    {"path", "hash", "exists", "kind": "file"|"dir", "files", "bytes",
     "listing_sha256",          # over "rel<TAB>size<TAB>mtime_ns" lines
     "content_sha256",          # when hash: over "rel<TAB>sha256" lines
     "listing": [[rel, size, mtime(, sha256)], ...], "listing_truncated"}
    """
    return [_fingerprint(Path(str(i["path"])), bool(i.get("hash")), listing_limit) for i in inputs]
