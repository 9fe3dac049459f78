"""A script importing a framework adapter whose extra is missing is refused at launch:
exit 2 at the import's file and line, with the pip command, and nothing submitted."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlhpc import _extras
from dlhpc._extras import Adapter, adapter_imports
from tests.unit._cli import local_exp_dir, run

SCRIPT = (
    "import argparse\n"
    "\n"
    "from dlhpc.integrations.lightning import DlhpcCallback, hparams\n"
    "import dlhpc.integrations.transformers as hf\n"
    "from dlhpc.integrations import lightning\n"
    "from dlhpc.integrations.script import main\n"
)


def test_adapter_imports_finds_every_import_form_with_its_line() -> None:
    assert adapter_imports(SCRIPT) == [
        (3, "dlhpc.integrations.lightning"),
        (4, "dlhpc.integrations.transformers"),
        (5, "dlhpc.integrations.lightning"),
    ]
    assert adapter_imports("def broken(:\n") == []


def _missing_lightning(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = Adapter("lightning", ("dlhpc_test_no_such_package",))
    monkeypatch.setitem(_extras.ADAPTERS, "dlhpc.integrations.lightning", fake)


def _experiment(d: Path, entrypoint: str) -> Path:
    yaml = d / "exp.yaml"
    yaml.write_text(
        f"name: extras\nentrypoint: {entrypoint}\n"
        "hyperparameters:\n  lr: {type: const, val: 0.1}\n"
        "searcher: {name: single, metric: loss, max_length: 1}\n"
    )
    return yaml


@pytest.mark.parametrize("dry_run", [True, False])
def test_launch_refuses_a_script_whose_adapter_extra_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dry_run: bool
) -> None:
    monkeypatch.setenv("DLHPC_HOME", str(tmp_path / "home"))
    d = local_exp_dir(tmp_path, monkeypatch, train=SCRIPT)
    _missing_lightning(monkeypatch)
    yaml = _experiment(d, "python train.py --lr {lr}")
    res = run("launch", str(yaml), *(["--dry-run"] if dry_run else []))
    assert res.exit_code == 2, res.output
    assert f"{d / 'train.py'}:3: import: dlhpc.integrations.lightning needs" in res.output
    assert "pip install 'dlhpc[lightning]'" in res.output
    assert f"{d / 'train.py'}:5:" in res.output
    assert not (tmp_path / "home" / "runs").exists() or not any(
        (tmp_path / "home" / "runs").iterdir()
    )


def test_an_installed_extra_or_a_site_interpreter_is_not_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DLHPC_HOME", str(tmp_path / "home"))
    d = local_exp_dir(tmp_path, monkeypatch, train=SCRIPT)
    monkeypatch.setitem(_extras.ADAPTERS, "dlhpc.integrations.lightning", Adapter("x", ("json",)))
    monkeypatch.setitem(_extras.ADAPTERS, "dlhpc.integrations.transformers", Adapter("y", ("os",)))
    assert run("launch", str(_experiment(d, "python train.py")), "--dry-run").exit_code == 0

    from dlhpc.config._adapters import check_adapters

    _missing_lightning(monkeypatch)
    assert check_adapters("python train.py", d, site_python="python3") == []
    assert [i.line for i in check_adapters("python train.py", d, site_python=None)] == [3, 5]
