"""Determined's Trial APIs in a script: what ``dlhpc convert determined`` refuses.

dlhpc's stand-in for the ``determined`` package runs Core API scripts; the modules of
Determined's Trial APIs and framework adapters (``determined.pytorch`` with
``PyTorchTrial`` and ``Trainer``, ``determined.keras``, ...) are not in it. The scripts
an entrypoint names are read (never run) and every import or ``det.<module>`` use of
one is reported with its line.
"""

from __future__ import annotations

import ast
from pathlib import Path

__all__ = ["TRIAL_MODULES", "scripts_of", "trial_api_uses"]

# the stand-in's UNSUPPORTED_APIS (dlhpc.integrations.determined; a test holds them equal)
TRIAL_MODULES = ("pytorch", "keras", "lightning", "transformers", "horovod")


def _unsupported(dotted: str) -> str | None:
    parts = dotted.split(".")
    if parts[0] == "determined" and len(parts) > 1 and parts[1] in TRIAL_MODULES:
        return f"determined.{parts[1]}"
    return None


def trial_api_uses(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of each use of a Trial API module in the Python file ``path``,
    in line order. Raises OSError, UnicodeDecodeError or SyntaxError for a file that
    cannot be read as Python."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    aliases = {"determined"}
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "determined":
                    aliases.add(alias.asname or alias.name)
                hit = _unsupported(alias.name)
                if hit:
                    found.append((node.lineno, hit))
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [f"{node.module}.{a.name}" for a in node.names]
            hits = [_unsupported(n) for n in [node.module, *names]]
            found += [(node.lineno, h) for h in dict.fromkeys(hits) if h]
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and node.attr in TRIAL_MODULES
        ):
            found.append((node.lineno, f"determined.{node.attr}"))
    return sorted(set(found))


def scripts_of(argv: list[str], context: Path) -> list[Path]:
    """The Python files of the context folder that the entrypoint's words name."""
    out = []
    for word in argv:
        path = context / word
        if word.endswith(".py") and path.is_file():
            out.append(path)
    return out
