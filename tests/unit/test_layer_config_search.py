"""config never reaches search, in any form: no import and no text naming it.

``lint-imports`` (the ``config-search`` contract in ``.importlinter``) sees the
imports; a module name in a string, loaded with importlib, is invisible to it.
This test refuses both under ``dlhpc/config``: the searchers reach the loader
only as its ``searchers`` argument (docs/ARCHITECTURE.md, Layers).
"""

from __future__ import annotations

import ast
from pathlib import Path

CONFIG = Path(__file__).resolve().parents[2] / "dlhpc" / "config"


def _imports(tree: ast.AST, package: str) -> list[str]:
    """Every module an ``import`` or ``from ... import`` names (``from dlhpc import
    search`` as ``dlhpc.search``), relative ones resolved against ``package``."""
    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            parent = parts[: len(parts) - node.level + 1] if node.level else []
            base = ".".join([*parent, *filter(None, [node.module])])
            out += [base, *(f"{base}.{alias.name}" for alias in node.names)]
    return out


def test_no_module_under_config_imports_or_names_search() -> None:
    files = sorted(CONFIG.rglob("*.py"))
    assert len(files) > 10, files
    found = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        rel = path.relative_to(CONFIG.parents[1])
        found += [
            f"{rel}: text {line.strip()!r}" for line in text.splitlines() if "dlhpc.search" in line
        ]
        found += [
            f"{rel}: imports {name}"
            for name in _imports(ast.parse(text), ".".join(rel.parent.parts))
            if name == "dlhpc.search" or name.startswith("dlhpc.search.")
        ]
    assert found == []


def test_the_scan_finds_what_it_refuses() -> None:
    code = "from dlhpc import search\nfrom .. import search as s\nfrom ..search import base\n"
    names = _imports(ast.parse(code), "dlhpc.config")
    assert names.count("dlhpc.search") == 3 and "dlhpc.search.base" in names
    assert _imports(ast.parse("import dlhpc.search._asha"), "dlhpc.config") == [
        "dlhpc.search._asha"
    ]
