"""``dlhpc example`` and ``dlhpc --version``, and the package data that carries the
examples and sites into a wheel (tests/integration/test_wheel_cluster.py installs one)."""

from __future__ import annotations

import fnmatch
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from click.testing import CliRunner

from dlhpc._extras import ADAPTERS, adapter_imports
from dlhpc._version import __version__
from dlhpc.cli._example import EXPERIMENT_FILES, example_root, examples
from dlhpc.cli.main import cli
from tests._config import load_experiment

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest and mypy need tomli on 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
ENV = {"HOME": "/home/alice", "USER": "alice", "PATH": "/nonexistent"}


def _invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_the_examples_are_the_checkouts_templates() -> None:
    # one source: the package's folder is a link to templates/examples, not a copy
    assert example_root().resolve() == REPO / "templates" / "examples"
    names = set(examples())
    assert {"digits", "argparse", "lightning", "hf-trainer", "determined-core"} <= names
    assert set(EXPERIMENT_FILES) <= names


def test_list_names_every_example_with_its_readme_title() -> None:
    code, out, _ = _invoke("example", "--list")
    assert code == 0
    lines = out.splitlines()
    assert [line.split()[0] for line in lines] == sorted(examples())
    digits = next(line for line in lines if line.startswith("digits "))
    assert "a small end-to-end example" in digits


@pytest.mark.parametrize("name", sorted(examples()))
def test_each_example_is_written_with_an_experiment_file_that_loads(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = _invoke("example", name)
    assert code == 0, err
    dest = tmp_path / name
    template = examples()[name]
    want = sorted(p.name for p in template.iterdir() if p.is_file() and p.name != "ruff.toml")
    assert sorted(p.name for p in dest.iterdir()) == want
    for file in want:
        assert (dest / file).read_bytes() == (template / file).read_bytes()
    experiment = EXPERIMENT_FILES.get(name, "asha.yaml")
    assert f"dlhpc launch {name}/{experiment} --follow" in out
    for script in dest.glob("*.py"):  # the loader refuses an adapter whose extra is missing
        for _, adapter in adapter_imports(script.read_text()):
            for module in ADAPTERS[adapter].modules:
                pytest.importorskip(module)
    cfg = load_experiment(dest / experiment, site="local", environ=ENV)
    assert cfg.workdir == dest


def test_into_a_named_folder_and_never_over_files(tmp_path: Path) -> None:
    dest = tmp_path / "a" / "b"
    assert _invoke("example", "digits", str(dest))[0] == 0
    assert (dest / "train.py").is_file()
    (dest / "train.py").write_text("mine\n")
    code, _, err = _invoke("example", "digits", str(dest))
    assert code == 2 and "not an empty folder" in err
    assert (dest / "train.py").read_text() == "mine\n"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _invoke("example", "argparse", str(empty))[0] == 0


def test_unknown_or_missing_name_is_refused(tmp_path: Path) -> None:
    code, _, err = _invoke("example", "digit", str(tmp_path / "x"))
    assert code == 2 and "unknown example 'digit'" in err and "digits" in err
    assert not (tmp_path / "x").exists()
    code, _, err = _invoke("example")
    assert code == 2 and "dlhpc example --list" in err


def test_version_comes_from_the_package_metadata() -> None:
    code, out, _ = _invoke("--version")
    assert code == 0
    assert out == f"dlhpc, version {metadata.version('dlhpc')}\n"


def test_the_metadata_version_is_the_modules() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["project"]["dynamic"] == ["version"]
    attr = project["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "dlhpc._version.__version__"
    assert (REPO / "CHANGELOG.md").read_text().count(f"## {__version__} ") == 1


def test_package_data_covers_every_file_of_the_sites_and_examples() -> None:
    # a file the globs miss would be absent from the wheel, and only there
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    globs = project["tool"]["setuptools"]["package-data"]["dlhpc"]
    links = {"site-configs": "site-configs", "templates/examples": "example-templates"}
    tracked = subprocess.run(  # the files a clone has (not a developer's caches)
        ["git", "ls-files", *links], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    files = [
        Path(links[src]) / path[len(src) + 1 :]
        for path in tracked
        for src in links
        if path.startswith(f"{src}/") and not path.endswith("ruff.toml")
    ]
    assert files
    missed = [f for f in files if not any(fnmatch.fnmatch(str(f), g) for g in globs)]
    assert missed == []
