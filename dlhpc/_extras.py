"""Which framework adapters need which optional extra, and where a script imports one.

The single table of adapter modules and the packages their extra installs: the adapters
raise :class:`~dlhpc.integrations._common.MissingExtraError` from it inside a job, and
the config loader reads a script's imports with :func:`adapter_imports` to refuse, at
launch, a script whose adapter's framework the job's interpreter lacks (exit 2, the
script's file and line, the ``pip install`` to run). Standard library only.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass

__all__ = ["ADAPTERS", "Adapter", "adapter_imports", "missing_modules"]


@dataclass(frozen=True)
class Adapter:
    """An adapter module's optional extra (``pip install 'dlhpc[extra]'``) and the
    top-level packages that extra provides."""

    extra: str
    modules: tuple[str, ...]

    @property
    def install(self) -> str:
        return f"pip install 'dlhpc[{self.extra}]'"


ADAPTERS: dict[str, Adapter] = {
    "dlhpc.integrations.lightning": Adapter("lightning", ("lightning",)),
    "dlhpc.integrations.transformers": Adapter("transformers", ("transformers", "accelerate")),
}


def _adapter_of(module: str) -> str | None:
    for name in ADAPTERS:
        if module == name or module.startswith(name + "."):
            return name
    return None


def adapter_imports(source: str) -> list[tuple[int, str]]:
    """``(line, adapter module)`` for each import of an adapter in Python ``source``
    (``import dlhpc.integrations.lightning``, ``from dlhpc.integrations.lightning
    import X``, ``from dlhpc.integrations import lightning``), in file order. Source
    that does not parse has none (the script's own error shows when it runs)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for adapter in {a for a in map(_adapter_of, names) if a is not None}:
            found.append((node.lineno, adapter))
    return sorted(found)


def missing_modules(adapter: str) -> list[str]:
    """The packages of ``adapter``'s extra that this interpreter cannot import."""
    return [m for m in ADAPTERS[adapter].modules if importlib.util.find_spec(m) is None]
