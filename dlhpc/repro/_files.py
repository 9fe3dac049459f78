"""File helpers of the record: sha256, ``.gitignore`` filtering, data fingerprints.

Standard library only (the job side imports :func:`fingerprint_data`). Contracts:

* :func:`gitignore_filter` lists the regular files under a folder that
  ``.gitignore`` rules do not exclude, with git itself when it is installed (a
  throw-away bare repository whose work tree is the folder, so every ``.gitignore``
  below it, negations included, is honoured), else with a small ``fnmatch``
  reading of the ``.gitignore`` files (``!``, trailing ``/``, anchored patterns);
  it says which it used.
* :func:`fingerprint_data` describes declared data inputs: file list, sizes,
  mtimes, a digest of that listing, and a content digest when asked; it never
  raises for a missing or unreadable path (it says so in the entry).
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["LISTING_LIMIT", "SKIP_DIRS", "file_sha256", "fingerprint_data", "gitignore_filter"]

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


def _git_list(root: Path) -> list[str]:
    scratch = tempfile.mkdtemp(prefix="dlhpc-ignore-")
    try:
        git_dir = str(Path(scratch) / "g")
        env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C"}
        subprocess.run(
            ["git", "init", "-q", "--bare", git_dir], env=env, check=True, timeout=15,
            capture_output=True,
        )  # fmt: skip
        proc = subprocess.run(
            ["git", f"--git-dir={git_dir}", f"--work-tree={root}", "ls-files", "--others",
             "--exclude-standard", "-z", *skip_pathspecs()],
            cwd=root, env=env, check=True, timeout=60, capture_output=True,
        )  # fmt: skip
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return [r for r in proc.stdout.decode(errors="replace").split("\0") if r]


_Rule = tuple[str, str, bool, bool, bool]  # base dir, pattern, negated, dir only, anchored


def _read_rules(folder: Path, base: str) -> list[_Rule]:
    try:
        lines = (folder / ".gitignore").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    rules = []
    for line in lines:
        line = line.rstrip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = line[1:] if negated else line
        dir_only = pattern.endswith("/")
        pattern = pattern.rstrip("/")
        anchored = "/" in pattern
        rules.append((base, pattern.lstrip("/"), negated, dir_only, anchored))
    return rules


def _ignored(rel: str, is_dir: bool, rules: Iterable[_Rule]) -> bool:
    ignored = False
    for base, pattern, negated, dir_only, anchored in rules:
        if base and not rel.startswith(base + "/"):
            continue
        sub = rel[len(base) + 1 :] if base else rel
        if dir_only and not is_dir:
            continue
        target = sub if anchored else sub.rsplit("/", 1)[-1]
        if fnmatch.fnmatchcase(target, pattern):
            ignored = not negated
    return ignored


def _fnmatch_list(root: Path) -> list[str]:
    out: list[str] = []
    rules: list[_Rule] = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        base = here.relative_to(root).as_posix()
        base = "" if base == "." else base
        rules.extend(_read_rules(here, base))
        prefix = f"{base}/" if base else ""
        dirnames[:] = sorted(
            d for d in dirnames if d not in SKIP_DIRS and not _ignored(prefix + d, True, rules)
        )
        out.extend(prefix + f for f in sorted(filenames) if not _ignored(prefix + f, False, rules))
    return out


def gitignore_filter(root: Path) -> tuple[list[str], str]:
    """(relative POSIX paths of the files under ``root`` not ignored, which rules)."""
    if shutil.which("git") is not None:
        try:
            return sorted(_git_list(root)), "git (.gitignore files, core.excludesFile)"
        except (OSError, subprocess.SubprocessError):
            pass
    return sorted(_fnmatch_list(root)), "fnmatch of .gitignore files (git not usable)"


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
