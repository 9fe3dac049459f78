"""scripts/test-pythons: its counts, where it finds each Python, and a version it cannot
test failing the run (the venvs and the pytest runs themselves are what CI runs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests._test_pythons import SCRIPT
from tests._test_pythons import test_pythons as tp


@pytest.mark.parametrize(
    ("output", "counts"),
    [
        ("5 failed, 1333 passed, 32 skipped, 8 deselected in 906.51s (0:15:06)", (1333, 5, 32)),
        ("1 passed, 2 errors in 0.50s", (1, 2, 0)),
        ("1 error in 0.10s", (0, 1, 0)),
        ("no tests ran in 0.01s", (0, 0, 0)),
        ("collecting ...\n", (0, 0, 0)),
        # the last summary line counts; a --durations line is none
        (
            "3 passed in 1.00s\n2.10s call tests/unit/a.py::b\n1 failed, 2 passed in 2.00s",
            (2, 1, 0),
        ),
    ],
)
def test_summary_counts(output: str, counts: tuple[int, int, int]) -> None:
    assert tp.summary_counts(output) == counts


def _python(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_the_newest_pyenv_release_then_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    versions = tmp_path / "pyenv" / "versions"
    for name in ("3.10.9", "3.10.13", "3.10.14t", "3.10-dev", "3.100.1"):
        _python(versions / name / "bin" / f"python{name[:4]}")
    on_path = _python(tmp_path / "bin" / "python3.12")
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "pyenv"))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert tp.interpreter("3.10") == versions / "3.10.13" / "bin" / "python3.10"
    assert tp.interpreter("3.12") == on_path
    assert tp.interpreter("3.13") is None


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": str(tmp_path), "PYENV_ROOT": str(tmp_path), "HOME": str(tmp_path)}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_python_not_found_fails_the_run_with_a_count(tmp_path: Path) -> None:
    proc = _run(tmp_path, "3.99", "--", "-x")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert "== python 3.99: FAILED (no Python 3.99 (pyenv or python3.99 on $PATH))" in lines[-2]
    assert lines[-1].startswith("0 passed, 1 failed, 0 skipped in ")
    assert not (SCRIPT.parents[1] / ".venv-py3.99").exists()


def test_a_version_that_is_not_one_is_a_usage_error(tmp_path: Path) -> None:
    proc = _run(tmp_path, "3")
    assert proc.returncode == 2
    assert "usage: scripts/test-pythons" in proc.stdout


def test_the_versions_are_pyprojects_classifiers() -> None:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pytest needs tomli on 3.10
        import tomli as tomllib
    project = tomllib.loads((SCRIPT.parents[1] / "pyproject.toml").read_text())["project"]
    prefix = "Programming Language :: Python :: "
    names = [c.removeprefix(prefix) for c in project["classifiers"] if c.startswith(prefix)]
    want = [name for name in names if name[:1].isdigit() and "." in name]  # not "3 :: Only"
    assert want and tp.supported() == want


def test_a_bare_run_tests_the_ends_of_the_range_but_the_whole_suites_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tp, "supported", lambda: ["3.9", "3.10", "3.11", "3.12", "3.13"])
    assert tp.default_versions("3.11") == ["3.9", "3.13"]
    assert tp.default_versions("3.13") == ["3.9", "3.12"]
    assert tp.default_versions(None) == ["3.9", "3.13"]
    monkeypatch.setattr(tp, "supported", lambda: ["3.10", "3.11"])
    assert tp.default_versions("3.11") == ["3.10"]


def test_every_unit_test_runs_with_fewer_examples_and_without_ci(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = _python(tmp_path / "bin" / "python")  # says what pytest would get
    fake.write_text(
        '#!/bin/sh\nprintf "%s|" "$@"\necho\n'
        'echo "fewer=${DLHPC_TEST_FEWER-unset} ci=${CI-unset}"\necho "1 passed in 0.01s"\n'
    )
    monkeypatch.setenv("CI", "1")
    monkeypatch.delenv("DLHPC_TEST_FEWER", raising=False)
    rc, out = tp.run_tests(fake, ["-x"])
    assert rc == 0 and tp.summary_counts(out) == (1, 0, 0)
    args, env = out.splitlines()[:2]
    assert args.startswith("-m|pytest|")
    assert args.endswith("|-m|not cluster and not browser|tests/unit|-x|"), args
    assert "--ignore" not in args and "--deselect" not in args  # every unit test, every file
    assert env == "fewer=1 ci=unset"
    (basetemp,) = [a for a in args.split("|") if a.startswith("--basetemp=")]
    root = tp.temp_root()  # /dev/shm where it may be written
    assert root is None or basetemp.startswith(f"--basetemp={root}/dlhpc-test-pythons-"), args
    assert not Path(basetemp.removeprefix("--basetemp=")).parent.exists()  # removed after
    assert capsys.readouterr().out == out  # passed through as it came
