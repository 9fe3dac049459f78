"""Fuzzing the loaders: whatever the input, only ConfigError (never a traceback).

A document that does load must also survive the JSON round trip the
orchestrator stores configs with, and loading must create no files.
"""

from __future__ import annotations

import contextlib
import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlhpc.config import ExperimentConfig, load_experiment, load_site
from dlhpc.config.serde import from_jsonable, to_jsonable
from dlhpc.errors import ConfigError

FUZZ = settings(
    max_examples=100,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

VALID: dict[str, Any] = {
    "name": "fuzz",
    "entrypoint": "python t.py",
    "site": "local",
    "resources": {"gpus_per_node": 1, "time": "00:30:00", "mem": "8G", "sbatch_args": ["--x=1"]},
    "environment": {"setup": "echo hi", "vars": {"A": "1"}},
    "hyperparameters": {
        "lr": {"type": "log", "minval": -4, "maxval": -1, "count": 2},
        "n": {"type": "int", "minval": 1, "maxval": 3, "count": 3},
        "c": {"type": "categorical", "vals": ["a", "b"]},
        "k": 5,
    },
    "searcher": {"name": "grid", "metric": "loss", "max_trials": 4, "seed": 1},
    "checkpoint": {"dir": "~/ck", "keep_best": 1},
    "preemption": {"signal": "USR1", "lead_time": "60s"},
    "reproducibility": {"deterministic": True},
    "deepspeed": {"config": {"fp16": {"enabled": True}}},
}

_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(allow_nan=True, allow_infinity=True),
    _text,
    st.sampled_from(["01:00:00", "2m", "UNLIMITED", "--array=1", "~/x", "$NOPE", "USR2", "grid"]),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_text, inner, max_size=4)),
    max_leaves=12,
)


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


_VALID_PATHS = _paths(VALID)[1:]


@st.composite
def _mutants(draw: st.DrawFn) -> Any:
    """VALID with a few values replaced or keys added, so that deep checks run."""
    doc = copy.deepcopy(VALID)
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from(_VALID_PATHS))
        parent = doc
        try:
            for part in path[:-1]:
                parent = parent[part]
            if draw(st.booleans()):
                parent[path[-1]] = draw(_values)
            elif isinstance(parent, dict):
                parent[draw(_text)] = draw(_values)
        except (KeyError, IndexError, TypeError):
            pass  # an earlier mutation replaced this subtree
    return doc


@pytest.fixture
def fuzz_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    (tmp_path / "home").mkdir()
    monkeypatch.chdir(tmp_path)
    return {"HOME": str(tmp_path / "home"), "PATH": str(tmp_path / "nobin"), "USER": "u"}


def _check(data: bytes, env: dict[str, str]) -> None:
    before = sorted(Path.cwd().rglob("*"))
    Path("exp.yaml").write_bytes(data)
    try:
        cfg = load_experiment("exp.yaml", environ=env)
    except ConfigError as exc:
        assert exc.issues and str(exc)
    else:
        back = from_jsonable(ExperimentConfig, json.loads(json.dumps(to_jsonable(cfg))))
        assert back == cfg
    with contextlib.suppress(ConfigError):  # the same input as a site file
        load_site("exp.yaml", env)
    assert sorted(Path.cwd().rglob("*")) == sorted({*before, Path.cwd() / "exp.yaml"})


def test_the_valid_base_document_loads(fuzz_env: dict[str, str]) -> None:
    Path("exp.yaml").write_text(yaml.safe_dump(VALID))
    cfg = load_experiment("exp.yaml", environ=fuzz_env)
    assert cfg.searcher.name == "grid" and cfg.deepspeed is not None


@FUZZ
@given(doc=_mutants())
def test_mutated_documents(fuzz_env: dict[str, str], doc: Any) -> None:
    _check(yaml.safe_dump(doc, allow_unicode=True).encode(), fuzz_env)


@FUZZ
@given(doc=_values)
def test_random_documents(fuzz_env: dict[str, str], doc: Any) -> None:
    _check(yaml.safe_dump(doc, allow_unicode=True).encode(), fuzz_env)


@FUZZ
@given(data=st.binary(max_size=200))
def test_random_bytes(fuzz_env: dict[str, str], data: bytes) -> None:
    _check(data, fuzz_env)


@FUZZ
@given(text=st.text(st.sampled_from("ab:- \n[]{},&*!<>|'\"#?%@`~.0\t\\"), max_size=80))
def test_random_yaml_like_text(fuzz_env: dict[str, str], text: str) -> None:
    _check(("name: x\nentrypoint: y\n" + text).encode(), fuzz_env)
