"""scripts/test-pythons as a module (its file name has no ``.py``), for its own tests and
for the wheel's, which finds each supported Python the way it does."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "test-pythons"


def _load() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("_test_pythons_script", str(SCRIPT))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    if spec is None:
        raise ImportError(f"cannot load {SCRIPT}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[loader.name] = module  # dataclasses look their module up there
    loader.exec_module(module)
    return module


test_pythons = _load()
