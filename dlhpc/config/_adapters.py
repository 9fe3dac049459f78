"""A script that imports a framework adapter whose extra is not installed is refused at
launch (exit 2, nothing submitted), at the import's file and line, with the ``pip
install`` that fixes it.

The scripts read are the ``*.py`` arguments of the entrypoint that exist under the
workdir. The check asks the interpreter dlhpc runs in, which is the jobs' interpreter
unless the site names another (``python:``, e.g. an environment activated by the setup
lines): then it cannot be asked from the login node, and a job that lacks the extra
fails at the import with the same message
(:class:`~dlhpc.integrations._common.MissingExtraError`).
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

from dlhpc._extras import ADAPTERS, adapter_imports, missing_modules
from dlhpc.errors import ConfigIssue

__all__ = ["check_adapters"]


def _scripts(entrypoint: str, workdir: Path) -> Iterator[Path]:
    try:
        tokens = shlex.split(entrypoint, comments=True)
    except ValueError:  # unbalanced quotes: the template check reports it
        return
    seen: set[Path] = set()
    for token in tokens:
        if not token.endswith(".py"):
            continue
        path = Path(token) if Path(token).is_absolute() else workdir / token
        if path not in seen and path.is_file():
            seen.add(path)
            yield path


def check_adapters(entrypoint: str, workdir: Path, site_python: str | None) -> list[ConfigIssue]:
    """One issue per adapter import in the entrypoint's scripts whose extra this
    interpreter lacks; none when the site runs jobs with another interpreter."""
    if site_python is not None:
        return []
    issues: list[ConfigIssue] = []
    for script in _scripts(entrypoint, workdir):
        try:
            source = script.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for line, adapter in adapter_imports(source):
            missing = missing_modules(adapter)
            if missing:
                issues.append(
                    ConfigIssue(
                        str(script),
                        line,
                        "import",
                        f"{adapter} needs {', '.join(missing)}, which {sys.executable} "
                        f"(the jobs' interpreter) cannot import: {ADAPTERS[adapter].install}",
                    )
                )
    return issues
