"""Unit tests of the single, grid and random searchers and the search-space helpers."""

from __future__ import annotations

import json
import math
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlhpc.config.schema import HParam, SearcherConfig
from dlhpc.search import (
    MAX_GRID_SIZE,
    BaseSearcher,
    Create,
    GridSearcher,
    RandomSearcher,
    SingleSearcher,
    default_value,
    grid_points,
    make_searcher,
    sample,
)

PLAIN_SCALARS = (int, float, str, bool, type(None))


def _space() -> dict[str, HParam]:
    return {
        "lr": HParam("lr", "log", minval=-4, maxval=-1, count=3),
        "hidden": HParam("hidden", "int", minval=16, maxval=128, count=2),
        "dropout": HParam("dropout", "double", minval=0.0, maxval=0.5, count=2),
        "batch_size": HParam("batch_size", "categorical", vals=(32, 64, 128)),
        "optimizer": HParam("optimizer", "const", value="adam"),
    }


def _cfg(name: str = "random", **kw: Any) -> SearcherConfig:
    return SearcherConfig(name=name, **kw)  # type: ignore[arg-type]


def _creates(ops: list[Any]) -> list[Create]:
    assert all(isinstance(op, Create) for op in ops)
    return list(ops)


# --- grid points -------------------------------------------------------------


@pytest.mark.parametrize(
    ("hp", "expected"),
    [
        (HParam("x", "int", minval=1, maxval=10, count=4), [1, 4, 7, 10]),
        (HParam("x", "int", minval=0, maxval=5, count=3), [0, 3, 5]),  # 2.5 rounds half up
        (HParam("x", "int", minval=1, maxval=3, count=10), [1, 2, 3]),  # deduplicated
        (HParam("x", "int", minval=2, maxval=8, count=1), [5]),  # one point: the midpoint
        (HParam("x", "double", minval=0.0, maxval=1.0, count=3), [0.0, 0.5, 1.0]),
        (HParam("x", "double", minval=-1.0, maxval=1.0, count=1), [0.0]),
        (HParam("x", "categorical", vals=("a", "b", 3)), ["a", "b", 3]),
        (HParam("x", "const", value=0.1), [0.1]),
    ],
)
def test_grid_points(hp: HParam, expected: list[Any]) -> None:
    points = grid_points(hp)
    assert points == expected
    assert [type(p) for p in points] == [type(e) for e in expected]


def test_grid_points_log() -> None:
    assert grid_points(HParam("lr", "log", minval=-3, maxval=-1, count=3)) == pytest.approx(
        [1e-3, 1e-2, 1e-1]
    )
    assert grid_points(HParam("x", "log", minval=1, maxval=4, count=4, base=2)) == [2, 4, 8, 16]


def test_grid_points_copies_mutable_values() -> None:
    hp = HParam("x", "categorical", vals=((1, 2), {"a": [1]}))
    points = grid_points(hp)
    assert points == [[1, 2], {"a": [1]}]  # tuples become lists, as after a JSON round trip
    points[1]["a"].append(2)
    assert hp.vals[1] == {"a": [1]}


@pytest.mark.parametrize(
    "hp",
    [
        HParam("x", "int", minval=1, maxval=10),  # grid needs count
        HParam("x", "double", minval=0.0, maxval=1.0, count=0),
        HParam("x", "log", maxval=1.0, count=2),  # no minval
        HParam("x", "int", minval=5, maxval=1, count=2),  # min > max
        HParam("x", "int", minval=1.2, maxval=1.8, count=2),  # no integer inside
        HParam("x", "categorical"),  # no vals
        HParam("x", "log", minval=0, maxval=1, base=1.0, count=2),
    ],
)
def test_grid_points_rejects_bad_hparams(hp: HParam) -> None:
    with pytest.raises(ValueError, match="'x'"):
        grid_points(hp)


def test_default_value() -> None:
    space = _space()
    assert default_value(space["hidden"]) == 72
    assert default_value(HParam("x", "int", minval=1, maxval=4)) == 3  # 2.5 half up
    assert default_value(space["dropout"]) == 0.25
    assert default_value(space["lr"]) == pytest.approx(10**-2.5)
    assert default_value(space["batch_size"]) == 32
    assert default_value(space["optimizer"]) == "adam"


# --- sampling ----------------------------------------------------------------

_bound = st.integers(min_value=-50, max_value=50)


@st.composite
def _range_hparams(draw: st.DrawFn) -> HParam:
    kind = draw(st.sampled_from(["int", "double", "log", "categorical", "const"]))
    if kind == "categorical":
        vals = draw(st.lists(st.one_of(st.integers(), st.text(max_size=5)), min_size=1))
        return HParam("x", "categorical", vals=tuple(vals))
    if kind == "const":
        return HParam("x", "const", value=draw(st.floats(allow_nan=False)))
    a, b = sorted((draw(_bound), draw(_bound)))
    if kind == "int":
        return HParam("x", "int", minval=a, maxval=b, count=draw(st.integers(1, 20)))
    if kind == "double":
        lo, hi = sorted(
            draw(st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)) for _ in range(2)
        )
        return HParam("x", "double", minval=lo, maxval=hi, count=draw(st.integers(1, 20)))
    base = draw(st.sampled_from([10.0, 2.0, math.e]))
    return HParam(
        "x", "log", minval=a / 10, maxval=b / 10, base=base, count=draw(st.integers(1, 20))
    )


def _assert_valid(hp: HParam, value: Any) -> None:
    if hp.type == "int":
        assert type(value) is int
        assert hp.minval is not None and hp.maxval is not None
        assert hp.minval <= value <= hp.maxval
    elif hp.type == "double":
        assert type(value) is float
        assert hp.minval is not None and hp.maxval is not None
        assert hp.minval <= value <= hp.maxval
    elif hp.type == "log":
        assert type(value) is float
        assert hp.minval is not None and hp.maxval is not None
        assert hp.base**hp.minval <= value <= hp.base**hp.maxval
    elif hp.type == "categorical":
        assert value in hp.vals
        assert type(value) in PLAIN_SCALARS
    else:
        assert value == hp.value


@settings(max_examples=200, deadline=None)
@given(hp=_range_hparams(), seed=st.integers(0, 2**32))
def test_sample_in_bounds_and_plain_type(hp: HParam, seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(5):
        _assert_valid(hp, sample(hp, rng))


@settings(max_examples=200, deadline=None)
@given(hp=_range_hparams())
def test_grid_points_in_bounds_and_plain_type(hp: HParam) -> None:
    points = grid_points(hp)
    assert 1 <= len(points) <= (hp.count or len(hp.vals) or 1)
    for p in points:
        _assert_valid(hp, p)
    if hp.type in ("int", "double", "log"):
        assert points == sorted(points, reverse=hp.type == "log" and hp.base < 1)


# --- grid searcher -----------------------------------------------------------


def test_grid_product_size_and_order() -> None:
    space = {
        "b": HParam("b", "int", minval=1, maxval=3, count=3),
        "a": HParam("a", "categorical", vals=("x", "y")),
        "c": HParam("c", "const", value=0),
    }
    s = GridSearcher(space, _cfg("grid", max_trials=1, max_length=7))
    ops = _creates(s.ask(100))
    assert s.total == len(ops) == 6  # max_trials does not cap the grid
    assert [op.request_id for op in ops] == list(range(6))
    assert {op.length for op in ops} == {7}
    # sorted names, last name fastest: (a, b, c)
    assert [(op.hparams["a"], op.hparams["b"]) for op in ops] == [
        ("x", 1), ("x", 2), ("x", 3), ("y", 1), ("y", 2), ("y", 3),
    ]  # fmt: skip
    assert all(op.hparams["c"] == 0 and list(op.hparams) == ["a", "b", "c"] for op in ops)


def test_grid_of_example_space_has_four_trials() -> None:
    space = {
        "lr": HParam("lr", "log", minval=-3, maxval=-1, count=2),
        "hidden": HParam("hidden", "int", minval=32, maxval=64, count=2),
        "dropout": HParam("dropout", "const", value=0.1),
        "batch_size": HParam("batch_size", "categorical", vals=(64,)),
    }
    s = make_searcher(space, _cfg("grid", max_length=5))
    assert len(s.ask(10)) == 4


def test_grid_refuses_huge_grids() -> None:
    ok = {f"h{i}": HParam(f"h{i}", "int", minval=0, maxval=9, count=10) for i in range(5)}
    assert GridSearcher(ok, _cfg("grid")).total == MAX_GRID_SIZE
    big = {**ok, "z": HParam("z", "categorical", vals=(1, 2))}
    with pytest.raises(ValueError, match="at most 100,000 points"):
        GridSearcher(big, _cfg("grid"))
    with pytest.raises(ValueError, match="at most 100,000 points"):
        GridSearcher({"d": HParam("d", "double", minval=0, maxval=1, count=10**9)}, _cfg("grid"))


# --- single and random searchers ---------------------------------------------


def test_single_searcher() -> None:
    s = SingleSearcher(_space(), _cfg("single", max_trials=5, max_length=3))
    ops = _creates(s.ask(10))
    assert len(ops) == 1 and ops[0].length == 3 and ops[0].request_id == 0
    assert ops[0].hparams == {
        "batch_size": 32,
        "dropout": 0.25,
        "hidden": 72,
        "lr": pytest.approx(10**-2.5),
        "optimizer": "adam",
    }
    assert s.ask(10) == []


def _random_hparams(seed: int, n: int = 10) -> list[dict[str, Any]]:
    s = RandomSearcher(_space(), _cfg(max_trials=n, seed=seed))
    return [op.hparams for op in _creates(s.ask(n))]


def test_random_is_deterministic_per_seed_and_differs_across_seeds() -> None:
    a = _random_hparams(1)
    assert a == _random_hparams(1)
    assert a != _random_hparams(2)
    assert len({json.dumps(h, sort_keys=True) for h in a}) > 1  # trials differ from each other
    for h in a:
        json.dumps(h)
        for name, hp in _space().items():
            _assert_valid(hp, h[name])


def test_random_trials_do_not_depend_on_batching_or_space_order() -> None:
    s = RandomSearcher(_space(), _cfg(max_trials=10, seed=1))
    batched = [op.hparams for n in (3, 0, 1, 4, 5) for op in _creates(s.ask(n))]
    assert batched == _random_hparams(1)
    reordered = dict(reversed(list(_space().items())))
    r = RandomSearcher(reordered, _cfg(max_trials=10, seed=1))
    assert [op.hparams for op in _creates(r.ask(10))] == batched


@settings(max_examples=50, deadline=None)
@given(
    name=st.sampled_from(["single", "grid", "random"]),
    max_trials=st.integers(1, 12),
    caps=st.lists(st.integers(0, 5), max_size=20),
)
def test_ask_respects_cap_and_total(name: str, max_trials: int, caps: list[int]) -> None:
    s = make_searcher(_space(), _cfg(name, max_trials=max_trials, max_length=2))
    total = {"single": 1, "grid": 3 * 2 * 2 * 3, "random": max_trials}[name]
    ids: list[int] = []
    for cap in caps:
        ops = _creates(s.ask(cap))
        assert len(ops) <= cap
        ids += [op.request_id for op in ops]
    ids += [op.request_id for op in _creates(s.ask(10**6))]
    assert ids == list(range(total))
    assert s.ask(5) == []


def test_ask_rejects_negative_cap() -> None:
    with pytest.raises(ValueError, match="max_new"):
        RandomSearcher(_space(), _cfg()).ask(-1)


# --- tell / done / state -----------------------------------------------------


def test_tell_keeps_best_per_request() -> None:
    for smaller, expected in ((True, 0.5), (False, 0.9)):
        s = RandomSearcher(_space(), _cfg(max_trials=2, smaller_is_better=smaller))
        s.ask(2)
        for length, metric in enumerate([0.7, 0.5, float("nan"), 0.9], start=1):
            s.tell(0, length, metric)
        assert s.best_metrics == {0: expected}
    with pytest.raises(ValueError, match="never created"):
        s.tell(2, 1, 0.1)
    with pytest.raises(ValueError, match="never created"):
        s.tell_exited(5)


def test_done_semantics() -> None:
    s = RandomSearcher(_space(), _cfg(max_trials=3))
    assert not s.done
    s.ask(2)
    s.tell_exited(0)
    s.tell_exited(1)
    assert not s.done  # one trial not created yet
    s.ask(5)
    assert not s.done  # created but running
    s.tell(2, 1, 0.3)
    s.tell_exited(2)
    s.tell_exited(2)  # idempotent
    assert s.done


def _roundtrip(s: BaseSearcher) -> BaseSearcher:
    fresh = make_searcher(s.space, s.config)
    fresh.load_state_dict(json.loads(json.dumps(s.state_dict())))
    return fresh


@pytest.mark.parametrize("name", ["single", "grid", "random"])
def test_state_roundtrip_mid_search(name: str) -> None:
    s = make_searcher(_space(), _cfg(name, max_trials=9, seed=3))
    first = s.ask(1)
    s.tell(0, 1, 0.4)
    s.tell_exited(0)
    restored = _roundtrip(s)
    assert restored.state_dict() == s.state_dict()
    for cap in (2, 0, 3, 100):
        assert restored.ask(cap) == s.ask(cap)
    assert restored.ask(1) == s.ask(1) == []
    assert first and isinstance(restored, type(s))
    assert restored.done == s.done


def test_load_state_rejects_mismatch() -> None:
    r = RandomSearcher(_space(), _cfg(max_trials=4))
    r.ask(2)
    with pytest.raises(ValueError, match="kind 'random'"):
        GridSearcher(_space(), _cfg("grid")).load_state_dict(r.state_dict())
    with pytest.raises(ValueError, match="space change"):
        RandomSearcher(_space(), _cfg(max_trials=5)).load_state_dict(r.state_dict())
    bad = {**r.state_dict(), "exited": [3]}
    with pytest.raises(ValueError, match="never created"):
        RandomSearcher(_space(), _cfg(max_trials=4)).load_state_dict(bad)


# --- registry ----------------------------------------------------------------


def test_registry_unknown_and_known() -> None:
    with pytest.raises(ValueError, match="unknown searcher 'nope'"):
        make_searcher(_space(), _cfg("nope"))
    assert type(make_searcher(_space(), _cfg("single"))) is SingleSearcher
    assert type(make_searcher(_space(), _cfg("grid"))) is GridSearcher
    assert type(make_searcher(_space(), _cfg("random"))) is RandomSearcher
