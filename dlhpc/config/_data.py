"""The experiment's declared data inputs: the top-level ``data:`` key.

``data:`` is a list whose items are a path, or a mapping ``{path: P, hash: true}``
(``hash`` defaults to false). Paths expand like every other path (``~``,
``${VAR}``, relative to the YAML's folder) and must exist at launch: each
attempt fingerprints them (file list, sizes, mtimes, and a content hash when
``hash`` is true; see :mod:`dlhpc.repro`). Contract of :func:`read_data`: it
reports every problem into ``issues`` (with the item's line) and returns the
inputs that passed, in file order; it only stats the paths.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dlhpc.config import _fields as F
from dlhpc.config._validate import Field, Invalid, Issues, boolean, describe, read_section, string
from dlhpc.config._yaml import KeyPath
from dlhpc.config.schema import DataInput

__all__ = ["read_data"]

_ENTRY = {
    "path": Field(string(nonempty=True), required=True),
    "hash": Field(boolean, default=False),
}
_SHAPE = "a path or a mapping {path: P, hash: true}"


def read_data(
    issues: Issues, value: Any, base: Path, env: Mapping[str, str]
) -> tuple[DataInput, ...]:
    """Validate ``data:`` (``None``: not given) into absolute, existing inputs."""
    if value is None:
        return ()
    if not isinstance(value, list):
        issues.add(("data",), f"must be a list of paths (each {_SHAPE}), got {describe(value)}")
        return ()
    check = F.path(base, env)
    out: list[DataInput] = []
    seen: dict[Path, int] = {}
    for i, item in enumerate(value):
        here: KeyPath = ("data", i)
        if isinstance(item, dict):
            s = read_section(issues, item, here, _ENTRY)
            raw, hashed, where = s["path"], s["hash"], (*here, "path")
            if raw is None:
                continue  # missing or bad: reported
        elif isinstance(item, str):
            raw, hashed, where = item, False, here
        else:
            issues.add(here, f"must be {_SHAPE}, got {describe(item)}")
            continue
        try:
            path = check(raw)
        except Invalid as exc:
            issues.add(where, str(exc))
            continue
        try:
            exists = path.exists()
        except OSError as exc:
            issues.add(where, f"cannot access {path}: {exc.strerror}")
            continue
        if not exists:
            issues.add(
                where, f"{path} does not exist (declared data is fingerprinted at every attempt)"
            )
        elif path in seen:
            issues.add(where, f"{path} is already declared at data[{seen[path]}]")
        else:
            seen[path] = i
            out.append(DataInput(path, hashed))
    return tuple(out)
