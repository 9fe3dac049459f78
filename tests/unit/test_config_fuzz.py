"""Fuzzing the loaders: whatever the input, only ConfigError (never a traceback, never a hang).

Inputs: random YAML documents, random YAML-like text, random bytes, and
mutations (structural and textual) of a rich valid document, of the shipped
examples (templates/examples/digits) and of the shipped site files. A document
that does load must also survive the JSON round trip the orchestrator stores
configs with and give a searcher that can ask for trials (what launch does
next); loading must create no files. Each example must finish within
:data:`HANG_S` seconds.

Bounded by default (``EXAMPLES`` per test); ``pytest --long`` (or
``DLHPC_LONG=1``) runs ``LONG_FACTOR`` times as many.
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlhpc.config import ExperimentConfig
from dlhpc.config.serde import from_jsonable, to_jsonable
from dlhpc.errors import ConfigError, UsageError
from dlhpc.search import make_searcher
from tests._alarm import time_bound
from tests._config import load_experiment, load_site
from tests.conftest import REPO

EXAMPLES = 100
LONG_FACTOR = 50
HANG_S = 20  # one example; the slowest legitimate ones take milliseconds

EXAMPLE_FILES = sorted((REPO / "templates" / "examples" / "digits").glob("*.yaml"))
SITE_FILES = sorted((REPO / "site-configs").glob("*.yaml"))
PARTITIONS = ("debug", "high")  # what the fake cluster answers to the partition check

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

_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)
_words = st.sampled_from(
    [
        "01:00:00", "2m", "UNLIMITED", "--array=1", "~/x", "$NOPE", "${HOME}", "USR2", "grid",
        "asha", "hyperband", "sha", "random", "bayes", "generic", "dev-cluster", "debug", "nope",
        "slurm", "auto", "local", "1-00:00:00", "-1", "0", "1e400", ".nan", "../x", "/dev/null",
    ]
)  # fmt: skip
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(allow_nan=True, allow_infinity=True),
    _text,
    _words,
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_text, inner, max_size=4)),
    max_leaves=12,
)
_KEYS = st.one_of(_text, st.sampled_from(["partition", "site", "backend", "partitions", "type"]))


def _fuzz(long_run: bool, examples: int = EXAMPLES) -> settings:
    return settings(
        max_examples=examples * LONG_FACTOR if long_run else examples,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
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


def _mutate(draw: st.DrawFn, base: Any) -> Any:
    """``base`` with 1-4 values replaced or keys added or removed, so deep checks run."""
    doc = copy.deepcopy(base)
    paths = _paths(base)[1:]
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from(paths))
        parent = doc
        try:
            for part in path[:-1]:
                parent = parent[part]
            op = draw(st.sampled_from(["replace", "add", "remove"]))
            if op == "replace":
                parent[path[-1]] = draw(_values)
            elif op == "add" and isinstance(parent, dict):
                parent[draw(_KEYS)] = draw(_values)
            elif op == "remove":
                del parent[path[-1]]
        except (KeyError, IndexError, TypeError):
            pass  # an earlier mutation replaced this subtree
    return doc


@st.composite
def _mutants(draw: st.DrawFn, bases: list[Any]) -> Any:
    return _mutate(draw, draw(st.sampled_from(bases)))


@st.composite
def _text_mutants(draw: st.DrawFn, texts: list[str]) -> bytes:
    """A shipped file's text with 1-3 edits: a slice deleted, junk inserted, a line
    duplicated or moved, a byte replaced; as bytes (junk may be binary)."""
    data = draw(st.sampled_from(texts)).encode()
    junk = st.one_of(
        st.binary(max_size=8),
        st.text(st.sampled_from("ab:- \n[]{},&*!<>|'\"#?%@`~.0\t\\"), max_size=8).map(str.encode),
    )
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(data)))
        op = draw(st.sampled_from(["delete", "insert", "dup-line", "move-line", "byte"]))
        if op == "delete":
            data = data[:at] + data[at + draw(st.integers(1, 20)) :]
        elif op == "insert":
            data = data[:at] + draw(junk) + data[at:]
        elif op in ("dup-line", "move-line"):
            lines = data.split(b"\n")
            i, j = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines)))
            line = lines[i] if op == "dup-line" else lines.pop(i)
            lines.insert(min(j, len(lines)), line)
            data = b"\n".join(lines)
        elif data:
            at = min(at, len(data) - 1)
            data = data[:at] + bytes([draw(st.integers(0, 255))]) + data[at + 1 :]
    return data


@pytest.fixture
def fuzz_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    (tmp_path / "home").mkdir()
    monkeypatch.chdir(tmp_path)
    return {"HOME": str(tmp_path / "home"), "PATH": str(tmp_path / "nobin"), "USER": "u"}


def _no_hang(seconds: int = HANG_S) -> contextlib.AbstractContextManager[None]:
    return time_bound(seconds, lambda: AssertionError(f"loading took over {seconds} s (a hang)"))


def _usable(cfg: ExperimentConfig) -> None:
    """What launch does with a loaded config must work: store it, ask its searcher."""
    back = from_jsonable(ExperimentConfig, json.loads(json.dumps(to_jsonable(cfg))))
    assert back == cfg
    try:
        searcher = make_searcher(cfg.hyperparameters, cfg.searcher)
    except UsageError:  # bayes without scikit-optimize: launch exits 2 with its message
        assert cfg.searcher.name == "bayes"
        return
    searcher.ask(min(cfg.searcher.max_concurrent_trials or 8, 8))


def _load(name: str, env: dict[str, str]) -> None:
    try:
        cfg = load_experiment(name, environ=env, partitions=lambda: PARTITIONS)
    except ConfigError as exc:
        assert exc.issues and str(exc)
    else:
        _usable(cfg)


def _check(data: bytes, env: dict[str, str], site: bytes | None = None) -> None:
    """Load ``data`` as an experiment (with ``site`` as its ``site.yaml``) and as a site."""
    before = sorted(Path.cwd().rglob("*"))
    Path("exp.yaml").write_bytes(data)
    written = {Path.cwd() / "exp.yaml"}
    if site is not None:
        Path("site.yaml").write_bytes(site)
        written.add(Path.cwd() / "site.yaml")
    with _no_hang():
        _load("exp.yaml", env)
        with contextlib.suppress(ConfigError):  # the same input as a site file
            load_site("exp.yaml", env)
    assert sorted(Path.cwd().rglob("*")) == sorted({*before, *written})


def _dump(doc: Any) -> bytes:
    return yaml.safe_dump(doc, allow_unicode=True).encode()


def test_the_valid_base_documents_load(fuzz_env: dict[str, str]) -> None:
    Path("exp.yaml").write_text(yaml.safe_dump(VALID))
    cfg = load_experiment("exp.yaml", environ=fuzz_env)
    assert cfg.searcher.name == "grid" and cfg.deepspeed is not None
    _usable(cfg)
    assert len(EXAMPLE_FILES) >= 3 and len(SITE_FILES) >= 3
    for file in EXAMPLE_FILES:
        _usable(load_experiment(file, environ=fuzz_env))
    for file in SITE_FILES:
        load_site(str(file), fuzz_env)


def _run(long_run: bool, strategy: st.SearchStrategy[Any], body: Callable[[Any], None]) -> None:
    given(strategy)(_fuzz(long_run)(body))()


def test_mutated_documents(fuzz_env: dict[str, str], long_run: bool) -> None:
    bases = [VALID] + [yaml.safe_load(f.read_text()) for f in EXAMPLE_FILES]
    _run(long_run, _mutants(bases), lambda doc: _check(_dump(doc), fuzz_env))


def test_mutated_site_files(fuzz_env: dict[str, str], long_run: bool) -> None:
    # An experiment on a mutated shipped site (some Slurm ones: the partition check runs).
    bases = [yaml.safe_load(f.read_text()) for f in SITE_FILES]
    exp = _dump({**VALID, "site": "site.yaml", "resources": {"partition": "debug"}})
    _run(long_run, _mutants(bases), lambda doc: _check(exp, fuzz_env, site=_dump(doc)))


def test_text_mutations_of_shipped_files(fuzz_env: dict[str, str], long_run: bool) -> None:
    texts = [f.read_text() for f in [*EXAMPLE_FILES, *SITE_FILES]]
    _run(long_run, _text_mutants(texts), lambda data: _check(data, fuzz_env))


def test_random_documents(fuzz_env: dict[str, str], long_run: bool) -> None:
    _run(long_run, _values, lambda doc: _check(_dump(doc), fuzz_env))


def test_random_bytes(fuzz_env: dict[str, str], long_run: bool) -> None:
    _run(long_run, st.binary(max_size=200), lambda data: _check(data, fuzz_env))


def test_random_yaml_like_text(fuzz_env: dict[str, str], long_run: bool) -> None:
    text = st.text(st.sampled_from("ab:- \n[]{},&*!<>|'\"#?%@`~.0\t\\"), max_size=80)
    _run(long_run, text, lambda t: _check(("name: x\nentrypoint: y\n" + t).encode(), fuzz_env))
