"""The README's "lines you add" table is what scripts/figures/adapter_lines.py measures on the
adapter examples, and every adapter named there has its example with both scripts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "adapter_lines", ROOT / "scripts/figures/adapter_lines.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["adapter_lines"] = module
    spec.loader.exec_module(module)
    return module


def test_every_adapter_has_its_example_with_the_plain_script_beside_it() -> None:
    lines = _script()
    for row in lines.ADAPTERS:
        folder, plain = lines.sources(row)
        assert (folder / lines.PLAIN).is_file(), folder
        assert (folder / plain).is_file(), (folder, plain)
        assert (folder / lines.ADAPTED).is_file(), folder
    assert list(lines.counts()) == list(lines.ADAPTERS)
    assert lines.sources("hf-trainer:train_plain_bare.py") == (
        lines.EXAMPLES / "hf-trainer",
        "train_plain_bare.py",
    )


def test_counts_lines_added_and_changed_but_not_blank_or_comment_lines(tmp_path: Path) -> None:
    lines = _script()
    (tmp_path / lines.PLAIN).write_text("import os\nargs = parse()\nrun(args)\n")
    (tmp_path / lines.ADAPTED).write_text(
        "import os\nimport dlhpc\n\n# a comment\nargs = dlhpc.fill(parse())\nrun(args)\n"
    )
    assert lines.count(tmp_path) == {"added": 2, "removed": 1}
    (tmp_path / "bare.py").write_text("import os\nargs = parse()\n")
    assert lines.count(tmp_path, "bare.py") == {"added": 3, "removed": 1}


def test_the_readme_table_is_the_measured_one() -> None:
    readme = (ROOT / "README.md").read_text()
    assert _script().table() in readme
