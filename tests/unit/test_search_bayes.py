"""The ``bayes`` searcher (scikit-optimize): space mapping, batches, purity, state, failures."""

from __future__ import annotations

import importlib.util
import json
import math
import statistics
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from dlhpc.cli.main import cli
from dlhpc.config.schema import HParam, SearcherConfig
from dlhpc.errors import DlhpcError, UsageError
from dlhpc.search import BayesSearcher, Create, RandomSearcher, make_searcher
from dlhpc.search._bayes import _plan, _skopt_dimensions

# The missing-dependency tests run anywhere; the rest need the 'bayes' extra.
needs_skopt = pytest.mark.skipif(
    importlib.util.find_spec("skopt") is None, reason="scikit-optimize not installed"
)

MIXED = (1, "a", 2.5, True, None, [1, 2], {"k": 1}, False, 1.0)


def _cfg(**kw: Any) -> SearcherConfig:
    base: dict[str, Any] = {"name": "bayes", "max_trials": 8, "max_length": 3, "seed": 0}
    return SearcherConfig(**{**base, **kw})


def _space() -> dict[str, HParam]:
    return {
        "lr": HParam("lr", "log", minval=-4, maxval=-1),
        "width": HParam("width", "int", minval=16, maxval=128),
        "drop": HParam("drop", "double", minval=0.0, maxval=0.5),
        "opt": HParam("opt", "categorical", vals=("sgd", "adam", "lion")),
        "tag": HParam("tag", "const", value={"a": [1]}),
    }


def _plain(value: Any) -> bool:
    """True when ``value`` is made of builtins only (no numpy scalars anywhere)."""
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return type(value) in (int, float, str, bool, type(None))


def _loss(h: dict[str, Any]) -> float:
    return float((math.log10(h["lr"]) + 2.5) ** 2 + (h["width"] - 64) ** 2 / 1e4 + h["drop"])


def _finish(s: BayesSearcher, op: Create, metric: float) -> None:
    s.tell(op.request_id, 1, metric + 1.0)  # an intermediate point: not a result
    s.tell(op.request_id, op.length, metric)
    s.tell_exited(op.request_id)


def _creates(ops: list[Any]) -> list[Create]:
    assert all(isinstance(op, Create) for op in ops)
    return list(ops)


# --- the space ----------------------------------------------------------------


@needs_skopt
def test_dimensions_map_types_bases_categoricals_and_consts() -> None:
    space = {
        "i": HParam("i", "int", minval=1.5, maxval=8),
        "d": HParam("d", "double", minval=-1.0, maxval=1.0),
        "lg": HParam("lg", "log", minval=-4, maxval=-1),
        "l2": HParam("l2", "log", minval=1, maxval=5, base=2.0),
        "c": HParam("c", "categorical", vals=MIXED),
        "k": HParam("k", "const", value={"a": [1, 2]}),
        "one": HParam("one", "int", minval=3, maxval=3),
        "only": HParam("only", "categorical", vals=("x",)),
    }
    fixed, dims = _plan(space)
    assert fixed == {"k": {"a": [1, 2]}, "one": 3, "only": "x"}
    import skopt.space as sk

    c, d, i, l2, lg = _skopt_dimensions(dims, sk)  # sorted by name
    assert isinstance(i, sk.Integer) and (i.low, i.high) == (2, 8)
    assert isinstance(d, sk.Real) and (d.low, d.high, d.prior) == (-1.0, 1.0, "uniform")
    assert isinstance(lg, sk.Real) and (lg.low, lg.high) == pytest.approx((1e-4, 1e-1))
    assert (lg.prior, lg.base) == ("log-uniform", 10.0)
    assert (l2.low, l2.high, l2.prior, l2.base) == (2.0, 32.0, "log-uniform", 2.0)
    assert isinstance(c, sk.Categorical) and list(c.categories) == list(range(len(MIXED)))

    s = BayesSearcher(space, _cfg(max_trials=12))
    ops = _creates(s.ask(12))  # past the 10 initial points: the GP (fit on lies) proposes too
    assert [op.request_id for op in ops] == list(range(12))
    for op in ops:
        h = op.hparams
        assert list(h) == sorted(space) and op.length == 3
        assert _plain(h) and json.loads(json.dumps(h)) == h
        assert type(h["i"]) is int and 2 <= h["i"] <= 8
        assert type(h["d"]) is float and -1 <= h["d"] <= 1
        assert 1e-4 <= h["lg"] <= 1e-1 and 2 <= h["l2"] <= 32
        assert any(h["c"] == v and type(h["c"]) is type(v) for v in MIXED)
        assert (h["k"], h["one"], h["only"]) == ({"a": [1, 2]}, 3, "x")
    ops[0].hparams["k"]["a"].append(3)  # a copy: the next config is untouched
    assert _creates(s.ask(1)) == [] and s.created == 12
    assert {repr(op.hparams["c"]) for op in ops} - {repr(v) for v in MIXED} == set()


@needs_skopt
def test_only_categoricals_and_only_consts() -> None:
    cats = {
        "a": HParam("a", "categorical", vals=(1, 2, 3)),
        "b": HParam("b", "categorical", vals=(True, False)),
    }
    s = BayesSearcher(cats, _cfg(max_trials=11))
    for op in _creates(s.ask(10)):
        _finish(s, op, float(op.hparams["a"]) + op.hparams["b"])
    (op,) = _creates(s.ask(5))  # the GP (Hamming kernel) proposes the last one
    assert op.hparams["a"] in (1, 2, 3) and type(op.hparams["b"]) is bool

    consts = {"k": HParam("k", "const", value=[1])}
    s = BayesSearcher(consts, _cfg(max_trials=2))
    assert [op.hparams for op in _creates(s.ask(5))] == [{"k": [1]}, {"k": [1]}]


# --- asking -----------------------------------------------------------------------


@needs_skopt
def test_batch_ask_distinct_points_respecting_max_new_and_max_trials() -> None:
    s = BayesSearcher(_space(), _cfg(max_trials=12, max_length=7))
    assert s.ask(0) == []
    first = _creates(s.ask(4))
    assert [op.request_id for op in first] == [0, 1, 2, 3] and {op.length for op in first} == {7}
    for op in first[:3]:
        _finish(s, op, _loss(op.hparams))  # request 3 keeps running (a lie)
    rest = _creates(s.ask(100))  # crosses from random points into the GP's batch
    assert [op.request_id for op in rest] == list(range(4, 12))
    points = [json.dumps(op.hparams, sort_keys=True) for op in first + rest]
    assert len(set(points)) == 12
    assert s.ask(3) == [] and not s.done
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="max_new"):
            s.ask(bad)  # type: ignore[arg-type]


def _drive(s: BayesSearcher, log: list[Any], calls: list[tuple[str, int]]) -> None:
    """Apply ``calls`` (("ask", n) or ("finish", k): finish the k oldest running)."""
    for call, n in calls:
        if call == "ask":
            log.append(s.ask(n))
        else:
            running = [r for r in range(s.created) if r not in s.results]
            for rid in running[:n]:
                (op,) = [o for ops in log for o in ops if o.request_id == rid]
                _finish(s, op, _loss(op.hparams))


CALLS_A = [("ask", 5), ("finish", 3), ("ask", 3), ("finish", 4)]
CALLS_B = [("ask", 2), ("finish", 3), ("ask", 9)]  # the last ask: 2 points by the GP


@needs_skopt
def test_same_seed_same_calls_same_asks_and_state_round_trip() -> None:
    a, b = (
        BayesSearcher(_space(), _cfg(max_trials=12)),
        BayesSearcher(_space(), _cfg(max_trials=12)),
    )
    log_a: list[Any] = []
    log_b: list[Any] = []
    _drive(a, log_a, CALLS_A)
    _drive(b, log_b, CALLS_A)
    assert log_a == log_b and a.state_dict() == b.state_dict()

    # Mid-run (a trial still running, 7 results): restore from JSON, then go on in lock step.
    saved = json.loads(json.dumps(a.state_dict(), allow_nan=False))
    c = BayesSearcher(_space(), _cfg(max_trials=12))
    c.load_state_dict(saved)
    assert c.state_dict() == a.state_dict()
    log_c = list(log_a)
    _drive(a, log_a, CALLS_B)  # the GP proposes from here on
    _drive(c, log_c, CALLS_B)
    assert log_c == log_a and c.state_dict() == a.state_dict()
    assert a.created == 12 and a.done == c.done is False
    assert len({json.dumps(op.hparams, sort_keys=True) for ops in log_a for op in ops}) == 12

    other = BayesSearcher(_space(), _cfg(max_trials=12, seed=1))
    assert other.ask(5) != log_a[0]


@needs_skopt
def test_load_state_rejects_mismatch() -> None:
    s = BayesSearcher(_space(), _cfg())
    for op in _creates(s.ask(2)):
        _finish(s, op, 1.0)
    state = s.state_dict()
    with pytest.raises(ValueError, match="kind 'random'"):
        s.load_state_dict(RandomSearcher(_space(), _cfg(name="random")).state_dict())
    with pytest.raises(ValueError, match="for 8 trials, this search has 9"):
        BayesSearcher(_space(), _cfg(max_trials=9)).load_state_dict(state)
    narrower = {**_space(), "width": HParam("width", "int", minval=16, maxval=64)}
    with pytest.raises(ValueError, match="space change"):
        BayesSearcher(narrower, _cfg()).load_state_dict(state)
    with pytest.raises(ValueError, match="never created"):
        s.load_state_dict({**state, "exited": [0, 1, 2]})
    with pytest.raises(ValueError, match="bad points"):
        s.load_state_dict({**state, "points": [[1.0]]})


# --- results -----------------------------------------------------------------------


@needs_skopt
def test_larger_is_better_concentrates_near_the_optimum() -> None:
    space = {"x": HParam("x", "double", minval=-5.0, maxval=5.0)}

    def score(x: float) -> float:  # larger is better, best at 1.7
        return -((x - 1.7) ** 2)

    def best_distance(xs: list[float]) -> float:
        return abs(max(xs, key=score) - 1.7)

    s = BayesSearcher(space, _cfg(max_trials=15, smaller_is_better=False, seed=3))
    xs: list[float] = []
    while not s.done:
        for op in _creates(s.ask(10 if s.created == 0 else 1)):
            xs.append(op.hparams["x"])
            _finish(s, op, score(op.hparams["x"]))
    randoms = [
        best_distance([op.hparams["x"] for op in _creates(r.ask(15))])
        for r in (
            RandomSearcher(space, _cfg(name="random", max_trials=15, seed=k)) for k in range(11)
        )
    ]
    assert best_distance(xs) < statistics.median(randoms)
    assert statistics.median(abs(x - 1.7) for x in xs[10:]) < 0.5  # the GP's five proposals


@needs_skopt
def test_observations_sign_lies_and_failures() -> None:
    s = BayesSearcher(_space(), _cfg(max_trials=8, smaller_is_better=False))
    ops = _creates(s.ask(7))
    s.tell(0, 3, 2.0)  # final
    s.tell(1, 1, 5.0)  # intermediate only, then stopped: its latest counts
    s.tell_exited(1)
    s.tell_exited(2)  # failed before reporting: nothing
    s.tell(3, 3, float("nan"))  # NaN final: the worst result so far
    s.tell(4, 1, 7.0)  # still running: a lie
    s.tell(5, 3, float("inf"))
    s.tell(6, 2, 1.0)
    s.tell(6, 2, float("-inf"))  # diverged, then killed
    s.tell_exited(6)
    xs, ys = s._observations()
    assert ys == [-2.0, -5.0, -2.0, -2.0, -2.0, -5.0]  # 0, 1, 3, 5, 6 (worst), then 4 (lie)
    assert xs == [s._points[r] for r in (0, 1, 3, 5, 6, 4)]
    assert s.results == {0: 2.0, 1: 5.0, 3: None, 5: None, 6: None}

    s.tell(0, 4, 100.0)  # after the result: ignored
    s.tell(2, 3, 100.0)  # after the exit: ignored
    assert s.results == {0: 2.0, 1: 5.0, 3: None, 5: None, 6: None}
    with pytest.raises(ValueError, match="never created"):
        s.tell(7, 1, 1.0)
    with pytest.raises(ValueError, match="never created"):
        s.tell_exited(-1)
    assert json.dumps(s.state_dict(), allow_nan=False)

    only_nan = BayesSearcher(_space(), _cfg(max_trials=2))
    only_nan.ask(1)
    only_nan.tell(0, 3, float("nan"))
    assert only_nan._observations() == ([], [])  # no finite value yet: skipped
    assert not s.done
    for op in ops:
        s.tell_exited(op.request_id)
    assert not s.done  # one trial left to create
    (last,) = _creates(s.ask(4))
    s.tell_exited(last.request_id)
    assert s.done and s.ask(1) == []


# --- without scikit-optimize -------------------------------------------------------


def test_missing_skopt_is_a_clear_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "skopt", None)  # makes `import skopt` fail
    with pytest.raises(UsageError, match=r"pip install 'dlhpc\[bayes\]'") as info:
        make_searcher(_space(), _cfg())
    assert info.value.exit_code == 2

    class Broken(types.ModuleType):
        def __getattr__(self, name: str) -> Any:
            raise TypeError("module 'numpy' has no attribute 'int'")

    monkeypatch.setitem(sys.modules, "skopt", Broken("skopt"))
    with pytest.raises(DlhpcError, match="installed but fails to import .*'int'") as broken:
        make_searcher(_space(), _cfg())
    assert broken.value.exit_code == 1


@needs_skopt
def test_launch_dry_run_and_without_skopt_exit_2(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DLHPC_SITE", "local")
    exp = tmp_path / "exp.yaml"
    exp.write_text(
        "name: bo\nentrypoint: python train.py\n"
        "hyperparameters:\n  x: {type: double, minval: 0, maxval: 1}\n"
        "searcher: {name: bayes, metric: loss, max_trials: 3, max_length: 2}\n"
    )
    res = CliRunner().invoke(cli, ["launch", str(exp), "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "3 trial(s)" in res.output
    monkeypatch.setitem(sys.modules, "skopt", None)
    for args in (["--dry-run"], []):
        res = CliRunner().invoke(cli, ["launch", str(exp), *args])
        assert res.exit_code == 2, res.output
        assert "error: searcher 'bayes' needs scikit-optimize" in res.output
        assert "pip install 'dlhpc[bayes]'" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(cli, ["status", "--json"])
    assert res.exit_code == 0 and json.loads(res.output)["experiments"] == []  # nothing recorded


@needs_skopt
def test_registry_builds_bayes() -> None:
    assert type(make_searcher(_space(), _cfg())) is BayesSearcher


@needs_skopt
def test_few_trials_are_not_random_search() -> None:
    """A third of max_trials (at most 10) are random; the GP proposes the rest, also for
    max_trials <= 10 (skopt's fixed 10 made those a random search)."""
    from dlhpc.search._bayes import initial_points

    assert [initial_points(n) for n in (1, 3, 6, 10, 20, 27, 28, 500)] == [1, 1, 2, 4, 7, 9, 10, 10]
    s = BayesSearcher(_space(), _cfg(max_trials=6))
    assert s.n_initial_points == 2
    for op, metric in zip(_creates(s.ask(2)), (0.3, 0.1), strict=True):
        _finish(s, op, metric)
    state = s.state_dict()
    gp = _creates(s.ask(1))[0].hparams
    # the same state with skopt's fixed rule (min(10, max_trials) = 6 random) asks otherwise
    old = BayesSearcher(_space(), _cfg(max_trials=6))
    old.load_state_dict({**state, "n_initial_points": 6})
    assert old.n_initial_points == 6
    assert _creates(old.ask(1))[0].hparams != gp
    again = BayesSearcher(_space(), _cfg(max_trials=6))
    again.load_state_dict(json.loads(json.dumps(state)))
    assert again.n_initial_points == 2 and _creates(again.ask(1))[0].hparams == gp
