"""The experiment's reproducibility record, collected on the login node at launch.

Contract of :func:`collect_launch_record`: it never raises for a missing tool or
a failing command (each part that cannot be had says why, under ``error``), runs
every external command with a timeout, writes nothing, and returns a JSON-able
dict (``RECORD_VERSION``)::

    {"version": 1, "collected_at", "host",
     "code": {"kind": "git", "root", "subdir", "commit", "branch", "remote", "dirty",
              "status", "diff", "diff_sha256", "diff_bytes", "diff_truncated",
              "untracked": [{"path", "size", "sha256"}], "digest"}
           | {"kind": "snapshot", "ignore_rules", "files", "bytes", "manifest": {rel: sha256},
              "digest"} | {..., "error": "past the limit ..."},
     "config": {"yaml_sha256", "resolved_sha256"},  # texts: experiments.yaml_text, config_json
     "python": {"version", "implementation", "executable"},
     "packages": {"source": "pip freeze" | "importlib.metadata", "items": {name: version}},
     "conda": {"prefix", "source": "conda-meta", "items": {...}} | None,
     "modules": {"loaded": [...], "files": [...]},
     "slurm": {"version"} | None,                    # the scheduler's version (any backend)
     "site": {"name", "source", "backend"},
     "data": [{"path", "hash"}]}

``pip freeze`` is started first and runs while git is asked (it costs about a
second, once per process while no package is installed or removed). ``code.digest``
identifies the code (commit + diff + untracked files, or the snapshot manifest) for
:mod:`dlhpc.repro._diff`.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlhpc.repro._files import SKIP_DIRS, code_files, file_sha256, skip_pathspecs

if TYPE_CHECKING:
    from dlhpc.config.schema import ExperimentConfig

__all__ = [
    "CODE_HASH_LIMIT",
    "DIFF_LIMIT",
    "RECORD_VERSION",
    "code_record",
    "collect_launch_record",
]

RECORD_VERSION = 1
CODE_HASH_LIMIT = 200 * 1024 * 1024  # bytes of non-ignored workdir files hashed (= snapshot limit)
CODE_FILES_LIMIT = 20_000
DIFF_LIMIT = 256 * 1024  # bytes of `git diff HEAD` kept in the record (its sha covers all)
_TIMEOUT_S = 15.0
_GIT_ENV = {"GIT_OPTIONAL_LOCKS": "0", "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}
_CREDENTIALS = re.compile(r"(?<=://)[^/@\s]+@")
_EDITABLE = re.compile(r"\((?P<name>[^=()\s]+)==(?P<version>[^)\s]+)\)")


def _run(argv: list[str], cwd: Path | None = None, timeout: float = _TIMEOUT_S) -> bytes:
    """stdout of ``argv``; raises RuntimeError with the cause on any failure."""
    try:
        proc = subprocess.run(
            argv,
            cwd=cwd,
            capture_output=True,
            timeout=timeout,
            check=False,
            env={**os.environ, **_GIT_ENV},
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise RuntimeError(f"{argv[0]} {argv[1]}: {err}") from None
    if proc.returncode != 0:
        why = proc.stderr.decode(errors="replace").strip().splitlines()
        raise RuntimeError(f"{' '.join(argv[:3])}: {why[-1] if why else proc.returncode}")
    return proc.stdout


def _git(workdir: Path, *args: str) -> str:
    return _run(["git", *args], cwd=workdir).decode(errors="replace").strip()


def _digest(parts: Iterable[str]) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\n")
    return h.hexdigest()


def _hashed(root: Path, rels: Iterable[str], limit: int, files_limit: int) -> dict[str, Any]:
    """``{"files", "bytes", "manifest": {rel: sha256}}`` or the same with ``error``
    when the files exceed ``limit`` bytes or ``files_limit`` files (nothing hashed)."""
    paths = []
    for rel in sorted(set(rels)):
        p = root / rel
        if p.is_file() and not p.is_symlink():
            paths.append((rel, p, p.stat().st_size))
    total = sum(size for _, _, size in paths)
    out: dict[str, Any] = {"files": len(paths), "bytes": total}
    if total > limit or len(paths) > files_limit:
        out["error"] = (
            f"{len(paths)} files, {total / 2**20:.1f} MiB: past the limit of the code record"
            f" ({files_limit} files, {limit / 2**20:.0f} MiB); nothing hashed. Keep data and"
            " outputs out of the workdir (or list them in .gitignore)"
        )
        return out
    out["manifest"] = {rel: file_sha256(p) for rel, p, _ in paths}
    return out


def _skipped(rel: str, skip: Path | None, root: Path) -> bool:
    parts = Path(rel).parts
    if any(part in SKIP_DIRS for part in parts) or rel.endswith(".pyc"):
        return True
    return skip is not None and (root / rel == skip or skip in (root / rel).parents)


def _git_code(workdir: Path, skip: Path | None, limit: int) -> dict[str, Any]:
    root = _git(workdir, "rev-parse", "--show-toplevel")
    rec: dict[str, Any] = {"kind": "git", "root": root}
    rec["subdir"] = _git(workdir, "rev-parse", "--show-prefix").rstrip("/") or "."
    try:
        rec["commit"] = _git(workdir, "rev-parse", "--verify", "HEAD")
    except RuntimeError as err:
        rec["commit"], rec["error"] = None, f"no commit yet: {err}"
    try:
        branch = _git(workdir, "rev-parse", "--abbrev-ref", "HEAD")
        rec["branch"] = None if branch == "HEAD" else branch
    except RuntimeError:
        rec["branch"] = None
    remotes = _git(workdir, "remote").split()
    remote = "origin" if "origin" in remotes else (remotes[0] if remotes else None)
    url = _git(workdir, "remote", "get-url", remote) if remote else None
    rec["remote"] = _CREDENTIALS.sub("<redacted>@", url) if url else None
    status = _git(workdir, "status", "--porcelain", "--", ".").splitlines()
    rec["dirty"] = bool(status)
    rec["status"] = status[:200]
    if rec["commit"] is not None:
        diff = _run(["git", "diff", "HEAD", "--binary", "--", "."], cwd=workdir)
        rec["diff_sha256"] = hashlib.sha256(diff).hexdigest()
        rec["diff_bytes"] = len(diff)
        rec["diff_truncated"] = len(diff) > DIFF_LIMIT
        rec["diff"] = diff[:DIFF_LIMIT].decode(errors="replace")
    others = _run(
        ["git", "ls-files", "--others", "--exclude-standard", "-z", *skip_pathspecs()], workdir
    )
    rels = [r for r in others.decode(errors="replace").split("\0") if r]
    rels = [r for r in rels if not _skipped(r, skip, workdir)]
    hashed = _hashed(workdir, rels, limit, CODE_FILES_LIMIT)
    rec["untracked"] = [
        {"path": rel, "sha256": sha} for rel, sha in hashed.get("manifest", {}).items()
    ]
    if "error" in hashed:
        rec["untracked_error"] = f"untracked files: {hashed['error']}"
    rec["digest"] = _digest(
        [
            str(rec["commit"]),
            rec.get("diff_sha256", ""),
            *(f"{u['path']} {u['sha256']}" for u in rec["untracked"]),
        ]
    )
    return rec


def _snapshot_code(workdir: Path, skip: Path | None, limit: int) -> dict[str, Any]:
    rels, rules = code_files(workdir, skip)  # exactly what the snapshot copies
    rec: dict[str, Any] = {"kind": "snapshot", "ignore_rules": rules}
    rec.update(_hashed(workdir, rels, limit, CODE_FILES_LIMIT))
    manifest = rec.get("manifest", {})
    rec["digest"] = _digest(f"{rel} {sha}" for rel, sha in manifest.items()) if manifest else None
    return rec


def code_record(
    workdir: Path, skip: Path | None = None, limit: int = CODE_HASH_LIMIT
) -> dict[str, Any]:
    """What identifies the code in ``workdir``: git facts when it is in a work tree
    (and git runs), else a content-addressed manifest honouring ``.gitignore``.
    ``skip`` (the state folder, when it lies inside) is left out."""
    if shutil.which("git") is not None:
        try:
            inside = _git(workdir, "rev-parse", "--is-inside-work-tree") == "true"
        except RuntimeError:
            inside = False
        if inside:
            try:
                return _git_code(workdir, skip, limit)
            except (RuntimeError, OSError) as err:
                return {"kind": "git", "error": str(err), "digest": None}
    try:
        return _snapshot_code(workdir, skip, limit)
    except OSError as err:
        return {"kind": "snapshot", "error": f"{workdir}: {err}", "digest": None}


# pip freeze results of this process, by interpreter and site folders' mtimes (an
# install or removal changes them): a process that launches many times (dlhpc simulate,
# tests) pays for one
_FREEZE_CACHE: dict[tuple[object, ...], dict[str, Any]] = {}


def _packages_key() -> tuple[object, ...]:
    stamps = []
    for entry in sys.path:
        if entry.endswith(("site-packages", "dist-packages")):
            try:
                stamps.append((entry, os.stat(entry).st_mtime_ns))
            except OSError:
                continue
    return (sys.executable, *stamps)


class _PipFreeze:
    """``pip freeze`` of this interpreter, started at once; :meth:`result` waits."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.proc: subprocess.Popen[bytes] | None = None
        self.error = ""
        self.key = _packages_key()
        if self.key in _FREEZE_CACHE:
            return
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pip", "--disable-pip-version-check", "freeze"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "PIP_NO_INPUT": "1"},
            )
        except OSError as err:
            self.error = str(err)

    def result(self, timeout: float = 60.0) -> dict[str, Any]:
        if self.key in _FREEZE_CACHE:
            return copy.deepcopy(_FREEZE_CACHE[self.key])
        if self.proc is not None:
            try:
                out, err = self.proc.communicate(timeout=timeout)
                if self.proc.returncode == 0:
                    got = {"source": "pip freeze", "items": parse_requirements(out.decode())}
                    _FREEZE_CACHE[self.key] = got
                    return copy.deepcopy(got)
                self.error = err.decode(errors="replace").strip()[-300:]
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.communicate()
                self.error = f"timed out after {timeout:.0f} s"
        from importlib import metadata

        items = {
            str(d.metadata["Name"]).lower(): d.version
            for d in metadata.distributions()
            if d.metadata["Name"]
        }
        return {
            "source": "importlib.metadata",
            "why": f"pip freeze failed: {self.error}",
            "items": dict(sorted(items.items())),
        }


def parse_requirements(text: str) -> dict[str, str]:
    """``pip freeze`` lines -> {lower-case name: version or the line's source part}."""
    items: dict[str, str] = {}
    editable = None  # pip's "# Editable install ... (name==version)" names the next -e line
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("#"):
            editable = _EDITABLE.search(line)
            continue
        if not line:
            continue
        if line.startswith("-e ") and editable is not None:
            name, version = editable["name"], f"{editable['version']} ({line})"
        elif "==" in line:
            name, version = line.split("==", 1)
        elif " @ " in line:
            name, version = line.split(" @ ", 1)
        elif "#egg=" in line:
            name, version = line.rsplit("#egg=", 1)[1], line
        else:
            name, version = line, ""
        items[name.strip().lower()] = version.strip()
        editable = None
    return dict(sorted(items.items()))


def _conda(environ: Mapping[str, str]) -> dict[str, Any] | None:
    prefix = environ.get("CONDA_PREFIX")
    if not prefix:
        return None
    items: dict[str, str] = {}
    meta = Path(prefix) / "conda-meta"
    try:
        for f in sorted(meta.glob("*.json")):
            d = json.loads(f.read_text(encoding="utf-8"))
            items[str(d.get("name"))] = f"{d.get('version')}={d.get('build', '')}"
    except (OSError, ValueError) as err:
        return {"prefix": prefix, "error": f"{meta}: {err}"}
    return {"prefix": prefix, "source": "conda-meta", "items": items}


def _sha_text(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def collect_launch_record(
    cfg: ExperimentConfig,
    *,
    skip: Path | None = None,
    code: dict[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    scheduler_version: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The launch record of ``cfg`` (see the module docstring).

    ``skip``: a folder inside the workdir to leave out of the code record (the
    state folder). ``code``: use this code record instead of reading the workdir
    (``dlhpc reproduce`` runs the original's snapshot). ``scheduler_version``:
    the backend's version record (``BaseScheduler.version_record``), kept under
    the record's ``slurm`` key (its name in older records).
    """
    from dlhpc.config.serde import to_jsonable  # the job side never needs the config package

    env = os.environ if environ is None else environ
    pip = _PipFreeze()
    modules = env.get("LOADEDMODULES", "")
    files = env.get("_LMFILES_", "")
    record: dict[str, Any] = {
        "version": RECORD_VERSION,
        "collected_at": time.time(),
        "host": socket.gethostname(),
        "code": code if code is not None else code_record(cfg.workdir, skip),
        "config": {
            "yaml_sha256": _sha_text(cfg.source),
            "resolved_sha256": _digest([json.dumps(to_jsonable(cfg), sort_keys=True)]),
        },
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
            "executable": sys.executable,
        },
        "conda": _conda(env),
        "modules": {
            "loaded": [m for m in modules.split(":") if m],
            "files": [f for f in files.split(":") if f],
            "site_lines": list(cfg.site.modules),
        },
        "slurm": scheduler_version,
        "site": {
            "name": cfg.site.name,
            "source": str(cfg.site.source) if cfg.site.source else None,
            "backend": cfg.backend,
        },
        "data": [{"path": str(d.path), "hash": d.hash} for d in cfg.data],
    }
    record["packages"] = pip.result()
    record["seconds"] = round(time.monotonic() - pip.started, 3)
    return record
