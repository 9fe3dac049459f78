"""A searcher defined only in the test tree, registered through the ``dlhpc.searchers``
entry points: ``tpairs`` of the test-only package in ``tests/plugins`` (see its README).

The tests put that folder on ``sys.path`` (the package is then installed, as
``pip install`` of a third-party package would install it) and check that
everything that knows searchers by name finds it: the experiment loader (its
settings rules and name check), the expected trial count, the report's rungs,
the simulator's list and :func:`make_searcher`. ``test_plugin_e2e.py`` runs an
experiment with it.
"""

from __future__ import annotations

import importlib.metadata
import textwrap
from pathlib import Path
from typing import Any

import pytest

from dlhpc.cli._run import _expected_trials
from dlhpc.errors import ConfigError
from dlhpc.report._page_data import rungs_of
from dlhpc.search import (
    Create,
    expected_trials,
    make_searcher,
    searcher_class,
    searcher_names,
)
from dlhpc.simulate._compare import searcher_problem
from tests._config import load_experiment

BUILTINS = ("single", "grid", "random", "bayes", "sha", "asha", "hyperband")


PLUGINS = Path(__file__).resolve().parents[1] / "plugins"


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test-only distribution that registers searcher ``tpairs``."""
    monkeypatch.syspath_prepend(str(PLUGINS))


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    (tmp_path / "home").mkdir()
    (tmp_path / "bin").mkdir()
    monkeypatch.chdir(tmp_path)
    return {"HOME": str(tmp_path / "home"), "PATH": str(tmp_path / "bin"), "USER": "alice"}


EXP = """\
name: t
entrypoint: python t.py
hyperparameters:
  lr: {type: log, minval: -4, maxval: -1}
searcher:
  name: tpairs
  max_trials: %s
"""


def load(env: dict[str, str], text: str) -> Any:
    Path("exp.yaml").write_text(textwrap.dedent(text))
    return load_experiment("exp.yaml", environ=env)


def problems(env: dict[str, str], text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load(env, text)
    assert info.value.exit_code == 2
    return str(info.value).splitlines()


@pytest.mark.usefixtures("installed")
def test_an_installed_searcher_is_found_everywhere(env: dict[str, str]) -> None:
    assert searcher_names() == (*BUILTINS, "tpairs")
    pairs = importlib.import_module("dlhpc_testplugins.searcher").PairsSearcher
    assert searcher_class("tpairs") is pairs

    cfg = load(env, EXP % 6 + "  min_length: 2\n")
    sc = cfg.searcher
    # its defaults: max_length 4, bounded concurrency because it learns
    assert (sc.name, sc.max_length, sc.min_length, sc.max_concurrent_trials) == ("tpairs", 4, 2, 16)
    assert expected_trials(sc, cfg.hyperparameters) == 3
    assert _expected_trials(cfg) == 3
    assert rungs_of({"name": "tpairs", "max_length": 8}) == (1, 8)
    assert searcher_problem(cfg, "tpairs") is None

    searcher = make_searcher(cfg.hyperparameters, sc)
    ops = searcher.ask(10)
    assert [op.request_id for op in ops if isinstance(op, Create)] == [0, 1, 2]
    restored = make_searcher(cfg.hyperparameters, sc)
    restored.load_state_dict(searcher.state_dict())
    assert restored.state_dict() == searcher.state_dict() and restored.state_dict()["version"] == 3


@pytest.mark.usefixtures("installed")
def test_an_installed_searchers_rules_report_with_file_and_line(env: dict[str, str]) -> None:
    assert problems(env, EXP % 3) == [
        "exp.yaml:7: searcher.max_trials: must be even for searcher 'tpairs'"
    ]
    lines = problems(env, EXP % 2 + "  mode: standard\n  stop_once: true\n")
    assert any(
        "exp.yaml:8: searcher.mode: only applies to searcher 'hyperband', not 'tpairs'" in ln
        for ln in lines
    ), lines
    assert any(
        "exp.yaml:9: searcher.stop_once: only applies to searchers 'sha', 'asha', 'hyperband', "
        "not 'tpairs'" in ln
        for ln in lines
    ), lines
    # a built-in's message for a key only the installed searcher knows names it too
    lines = problems(env, EXP.replace("tpairs", "random") % 2 + "  min_length: 2\n")
    assert any("'sha', 'asha', 'hyperband', 'tpairs', not 'random'" in ln for ln in lines), lines


def test_without_the_package_the_name_is_unknown(env: dict[str, str]) -> None:
    lines = problems(env, EXP % 2)
    known = ", ".join(BUILTINS)
    assert any(
        f"exp.yaml:6: searcher.name: must be one of {known}, got 'tpairs'" in ln for ln in lines
    )
    with pytest.raises(ValueError, match=r"unknown searcher 'tpairs' \(known: asha, bayes"):
        searcher_class("tpairs")
    assert rungs_of({"name": "tpairs", "max_length": 8}) == ()


def test_built_in_names_do_not_scan_entry_points(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    scan = importlib.metadata.entry_points

    def no_scan(**kw: Any) -> Any:
        # other groups (the scheduler backends that `backend: auto` weighs) may be read
        if kw.get("group") == "dlhpc.searchers":
            raise AssertionError("entry points scanned for a built-in searcher")
        return scan(**kw)

    monkeypatch.setattr(importlib.metadata, "entry_points", no_scan)
    cfg = load(env, EXP.replace("tpairs", "sha") % 4 + "  max_length: 9\n")
    assert expected_trials(cfg.searcher, cfg.hyperparameters) == 4
    assert rungs_of({"name": "sha", "max_length": 9, "max_rungs": 3}) == (1, 3, 9)
    assert type(make_searcher(cfg.hyperparameters, cfg.searcher)).kind == "sha"


@pytest.mark.usefixtures("installed")
def test_an_entry_point_that_is_no_searcher_is_refused(
    tmp_path: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    dist = tmp_path / "bad" / "dlhpc_bad-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: dlhpc-bad\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[dlhpc.searchers]\nwrongkind = dlhpc_testplugins.searcher:PairsSearcher\n"
        f"notone = {__name__}:BUILTINS\n"
        "broken = dlhpc_no_such_module:Searcher\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path / "bad"))
    with pytest.raises(ValueError, match="registered for a class of kind 'tpairs'"):
        searcher_class("wrongkind")
    with pytest.raises(ValueError, match=r"'notone' .*BUILTINS\) is not a dlhpc.search.BaseSea"):
        searcher_class("notone")
    # the loader reports it like any bad value (exit 2), and still checks the rest
    lines = problems(env, EXP.replace("tpairs", "broken") % 2 + "  divisor: 1\n")
    assert lines[0].startswith(
        "exp.yaml:6: searcher.name: cannot load searcher 'broken' "
        "(dlhpc_no_such_module:Searcher): No module named"
    ), lines
    assert lines[1] == "exp.yaml:8: searcher.divisor: must be an integer >= 2, got 1", lines
    # the searchers a message lists leave the broken ones out
    lines = problems(env, EXP.replace("tpairs", "random") % 2 + "  mode: standard\n")
    assert lines == [
        "exp.yaml:8: searcher.mode: only applies to searcher 'hyperband', not 'random'"
    ]


def test_a_built_in_name_cannot_be_taken(
    tmp_path: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    dist = tmp_path / "taker" / "dlhpc_taker-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: dlhpc-taker\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[dlhpc.searchers]\ngrid = dlhpc_testplugins.searcher:PairsSearcher\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path / "taker"))
    monkeypatch.syspath_prepend(str(PLUGINS))
    # the built-in is what the name means (asking for it reads no entry point) ...
    assert searcher_class("grid").__name__ == "GridSearcher"
    # ... and listing the searchers refuses the package that takes its name
    taken = "entry point grid = dlhpc_testplugins.searcher:PairsSearcher .*built-in searcher name"
    with pytest.raises(ValueError, match=taken):
        searcher_names()
    with pytest.raises(ValueError, match=taken):
        searcher_class("tpairs")
    lines = problems(env, EXP % 2)
    assert lines[0].startswith("exp.yaml:6: searcher.name: entry point grid = "), lines
