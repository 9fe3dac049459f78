"""The searchers' saved state: plain JSON columns, exact floats, same decisions, refusals.

``tests/data/searcher-call-logs.json`` holds the calls of seeded random runs of sha and
asha searchers (``proposer: random``; ``ask`` with its answer, ``tell``, ``tell_exited``)
as dlhpc made them when they were recorded, and the calls before which a run is saved
here and restored.
"""

from __future__ import annotations

import json
import math
import re
import struct
from itertools import cycle
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dlhpc.config import ExperimentConfig
from dlhpc.config.schema import HParam, SearcherConfig
from dlhpc.orchestrator.stored import searcher_of, state_json
from dlhpc.search import (
    ASHASearcher,
    BaseSearcher,
    Continue,
    Create,
    HyperbandSearcher,
    Operation,
    RandomSearcher,
    SHASearcher,
    make_searcher,
)
from dlhpc.search._columns import decode_floats, decode_ints, decode_metric, encode_floats
from dlhpc.search._rungstate import TrialTable, encode_results
from tests.unit.test_search_adaptive import FakeDriver, Twin

SPACE = {
    "x": HParam("x", "double", minval=0.0, maxval=1.0),
    "width": HParam("width", "int", minval=8, maxval=64),
}
LOGS = json.loads(
    (Path(__file__).resolve().parents[1] / "data" / "searcher-call-logs.json").read_text()
)
# every double but NaN is itself after a round trip; NaN is NaN
FLOATS = st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True)
EDGES = [math.nan, math.inf, -math.inf, -0.0, 0.0, 5e-324, -5e-324, 2.2250738585072014e-308]
EDGES += [1.7976931348623157e308, 0.1]


def _cfg(**kw: Any) -> SearcherConfig:
    return SearcherConfig(**{"max_length": 27, "max_rungs": 4, "metric": "loss", **kw})


def _through_text(s: BaseSearcher) -> BaseSearcher:
    """``s`` saved and restored as the orchestrator does (``experiments.searcher_state``)."""
    # searcher_of reads these two fields only
    cfg = cast(ExperimentConfig, SimpleNamespace(hyperparameters=s.space, searcher=s.config))
    text = state_json(s)
    restored = searcher_of(cfg, text)
    assert state_json(restored) == text
    return restored


def _json(s: BaseSearcher) -> dict[str, Any]:
    """The state as stored and read back (strict JSON: no NaN literals)."""
    loaded: dict[str, Any] = json.loads(json.dumps(s.state_dict(), allow_nan=False))
    return loaded


def _bits(v: float) -> bytes | str:
    return "nan" if math.isnan(v) else struct.pack("<d", v)


def _op(op: Operation) -> list[Any]:
    if isinstance(op, Create):
        return ["create", op.request_id, op.hparams, op.length]
    if isinstance(op, Continue):
        return ["continue", op.request_id, op.length]
    return ["stop", op.request_id]


@pytest.mark.parametrize("case", LOGS, ids=lambda c: "-".join(map(str, c["searcher"].values())))
def test_saved_and_restored_runs_answer_as_logged(case: dict[str, Any]) -> None:
    s = make_searcher(SPACE, _cfg(proposer="random", **case["searcher"]))
    assert case["saves"]
    for i, call in enumerate(case["log"]):
        if i in case["saves"]:
            s = _through_text(s)
        if call[0] == "ask":
            assert [_op(op) for op in s.ask(call[1])] == call[2], f"call {i}"
        elif call[0] == "tell":
            s.tell(call[1], call[2], call[3])
        else:
            s.tell_exited(call[1])
    assert s.done


@settings(max_examples=200, deadline=None)
@given(values=st.lists(FLOATS, max_size=20))
@example(values=EDGES)
def test_float_columns_round_trip_exactly(values: list[float]) -> None:
    text = orjson.dumps(encode_floats(values)).decode()  # as state_json writes
    assert json.loads(text) == json.loads(json.dumps(encode_floats(values), allow_nan=False))
    assert list(map(_bits, decode_floats(orjson.loads(text)))) == list(map(_bits, values))


def test_float_columns_refuse_other_text() -> None:
    for bad in ("NaN", "Infinity", "1.5", ""):
        with pytest.raises(ValueError, match="not a float"):
            decode_metric(bad)
    for wrong in (None, True, [1.0]):
        with pytest.raises(TypeError, match="not a float"):
            decode_metric(wrong)
    with pytest.raises(TypeError, match="list of floats"):
        decode_floats("d:AAAA")
    for item in ("NaN", "Infinity", "1.5", None, [1.0]):
        with pytest.raises(TypeError, match="must be real number|unhashable"):
            decode_floats([0.5, item])
    with pytest.raises(TypeError, match="list of integers"):
        decode_ints({"0": 1})
    with pytest.raises(TypeError):
        decode_ints([1, 0.5])
    with pytest.raises(OverflowError):
        decode_ints([2**63])


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(["asha", "sha", "hyperband"]), values=st.lists(FLOATS, min_size=1))
@example(name="asha", values=EDGES)
@example(name="sha", values=EDGES)
@example(name="hyperband", values=EDGES)
def test_rung_metrics_round_trip_exactly(name: str, values: list[float]) -> None:
    """Rung results and last reports come back bit for bit (NaN as NaN)."""
    s = make_searcher(SPACE, _cfg(name=name, max_trials=len(values), seed=3))
    created = [op.request_id for op in s.ask(len(values)) if isinstance(op, Create)]
    for rid, v in zip(created, values, strict=False):
        s.tell(rid, 1 if name != "hyperband" else 27, v)
    restored = _through_text(s)
    assert isinstance(s, ASHASearcher | SHASearcher)
    assert isinstance(restored, ASHASearcher | SHASearcher)
    before, after = s.rung_table(), restored.rung_table()
    assert [{k: _bits(v) for k, v in r.items()} for r in before] == [
        {k: _bits(v) for k, v in r.items()} for r in after
    ]
    told = {rid: v for rid, v in zip(created, values, strict=False)}
    assert told and all(_bits(restored._trials[rid].last[1]) == _bits(v) for rid, v in told.items())  # type: ignore[index]


def test_best_metrics_of_fixed_searchers_round_trip_exactly() -> None:
    s = RandomSearcher(SPACE, _cfg(name="random", max_trials=8, seed=1))
    s.ask(8)
    values = [math.inf, -math.inf, -0.0, 5e-324, 1.7976931348623157e308, 0.1]
    for rid, v in enumerate(values):
        s.tell(rid, 1, v)
    restored = _through_text(s)
    assert isinstance(restored, RandomSearcher)
    assert {k: _bits(v) for k, v in restored.best_metrics.items()} == {
        rid: _bits(v) for rid, v in enumerate(values)
    }


class _SavedEvery(Twin):
    """Drives a searcher and a copy saved and restored as text every ``every`` calls;
    every ask answers the same (:class:`Twin`'s comparisons)."""

    def __init__(self, a: BaseSearcher, b: BaseSearcher, every: int) -> None:
        super().__init__(a, b, switch_at=0)
        self.every = every

    def _tick(self) -> None:
        self.calls += 1
        if self.calls % self.every == 0:
            self.b = _through_text(self.b)


SETTINGS = [
    {"name": "asha"},
    {"name": "asha", "stop_once": True, "smaller_is_better": False},
    {"name": "asha", "proposer": "tpe", "max_budget": 400},
    {"name": "sha"},
    {"name": "sha", "stop_once": True},
    {"name": "hyperband", "mode": "conservative"},
    {"name": "hyperband", "proposer": "tpe", "smaller_is_better": False},
]


@settings(max_examples=40, deadline=None)
@given(
    kw=st.sampled_from(SETTINGS),
    seed=st.integers(0, 2**16),
    every=st.integers(1, 40),
    values=st.lists(FLOATS, min_size=1, max_size=30),
)
def test_restored_searchers_decide_as_never_saved(
    kw: dict[str, Any], seed: int, every: int, values: list[float]
) -> None:
    """Any metrics (NaN, infinities, -0.0, subnormals), saved and restored at any pace:
    the same operations as a searcher never saved, and the same state at the end."""
    a = make_searcher(SPACE, _cfg(max_trials=20, seed=seed, **kw))
    twin = _SavedEvery(a, make_searcher(SPACE, a.config), every)
    told = cycle(values)
    driver = FakeDriver(
        twin,
        slots=5,
        seed=seed,
        marks=[1, 3, 9, 27],
        max_length=27,
        fail_p=0.05,
        extra_points=True,
        random_max_new=True,
        metric=lambda hp, n, rng: next(told),
    )
    driver.run()
    assert state_json(twin.a) == state_json(twin.b)


def _mid_run(name: str = "asha", **kw: Any) -> tuple[BaseSearcher, dict[str, Any]]:
    """A searcher with paused, running and exited trials, NaN results, and its state."""
    s = make_searcher(SPACE, _cfg(name=name, max_trials=12, seed=5, **kw))
    for rid, op in enumerate(s.ask(9)):
        assert isinstance(op, Create)
        s.tell(op.request_id, op.length, math.nan if rid == 4 else rid / 10)
    s.tell_exited(7)
    s.ask(2)
    return s, _json(s)


def _with(state: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(state))
    node: Any = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


def _asha_corruptions(state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    trials = state["trials"]
    status, grant, n = trials["status"], trials["grant"], len(trials["status"])
    ids, m = state["results"][0][0]["ids"], state["results"][0][0]["metrics"]
    assert m[0] < m[1]
    paused = status.index("paused")
    unpaused_ids = [rid for rid in ids if rid != paused]
    told = dict(zip(ids, map(decode_metric, m), strict=True))
    return {
        "a column as text": _with(state, ("trials", "grant"), "B:AAAA"),
        "a float in an integer column": _with(state, ("trials", "grant"), [0.5, *grant[1:]]),
        "not a column table": _with(state, ("trials",), [[0, 0, "weird", 0, None]]),
        "a column missing": _with(state, ("trials", "has_last"), None),
        "statuses not a list": _with(state, ("trials", "status"), "paused"),
        "columns of two lengths": _with(state, ("trials", "status"), status[:-1]),
        "unknown status": _with(state, ("trials", "status"), ["weird", *status[1:]]),
        "has_last 2": _with(state, ("trials", "has_last"), [2] + [False] * (n - 1)),
        "a length past 64 bits": _with(state, ("trials", "last_length"), [2**64] * n),
        "a metric in other text": _with(state, ("trials", "last_metric"), ["NaN"] * n),
        "grant out of range": _with(state, ("trials", "grant"), [5, *grant[1:]]),
        "bracket out of range": _with(state, ("trials", "bracket"), [1] + [0] * (n - 1)),
        "result of a request never created": _with(
            state, ("results", 0, 0, "ids"), [*ids[:-1], 40]
        ),
        "results out of rank order": _with(
            state, ("results", 0, 0, "metrics"), [m[1], m[0], *m[2:]]
        ),
        "a result twice": _with(
            state, ("results", 0, 0), {"ids": [ids[0], ids[0]], "metrics": [0.0, 0.1]}
        ),
        "paused without a result": _with(
            state, ("results", 0, 0), encode_results(unpaused_ids, told)
        ),
        "ids and metrics of two lengths": _with(state, ("results", 0, 0, "ids"), ids[:-1]),
        "too many trials": _with(
            state, ("trials",), {k: v * 2 for k, v in state["trials"].items()}
        ),
        "a stop never created": _with(state, ("stops",), [99]),
        "finalised of two brackets": _with(state, ("finalised",), [False, False]),
        "wrong number of rungs": _with(state, ("results", 0), state["results"][0][:-1]),
    }


# What the error says for each corruption of _asha_corruptions.
REFUSALS = {
    "a column as text": "expected a list of integers, got str",
    "a float in an integer column": "cannot be interpreted as an integer",
    "not a column table": "expected the table of columns",
    "a column missing": "expected a list of integers, got NoneType",
    "statuses not a list": "expected a list of statuses",
    "columns of two lengths": "columns differ in length",
    "unknown status": "unknown status or has_last",
    "has_last 2": "unknown status or has_last",
    "a length past 64 bits": "int too big to convert",
    "a metric in other text": "must be real number, not str",
    "grant out of range": "request 0: grant or rung out of range",
    "bracket out of range": "a trial names a bracket that does not exist",
    "result of a request never created": "a rung result names a request never created",
    "results out of rank order": "not in rank order",
    "a result twice": "a request has two results in one rung",
    "paused without a result": "paused without a result at its grant",
    "ids and metrics of two lengths": "ids and metrics differ in length",
    "too many trials": "too many trials",
    "a stop never created": "a pending stop names a request never created",
    "finalised of two brackets": "zip()",
    "wrong number of rungs": "wrong number of rungs",
}


def test_corrupt_states_are_refused() -> None:
    s, state = _mid_run()
    assert "paused" in state["trials"]["status"]
    corruptions = _asha_corruptions(state)
    assert corruptions.keys() == REFUSALS.keys()
    for label, bad in corruptions.items():
        fresh = make_searcher(SPACE, s.config)
        message = "asha searcher: malformed state: .*" + re.escape(REFUSALS[label])
        with pytest.raises(ValueError, match=message):
            fresh.load_state_dict(bad)
        assert isinstance(fresh, ASHASearcher) and fresh.created == 0, label
        assert fresh.state_dict() == make_searcher(SPACE, s.config).state_dict(), label
    fine = make_searcher(SPACE, s.config)
    fine.load_state_dict(state)
    assert fine.state_dict() == s.state_dict()


def test_states_of_another_config_or_kind_are_refused() -> None:
    s, state = _mid_run()
    for key in ("max_budget", "proposer", "lengths"):  # a setting missing: another config
        with pytest.raises(ValueError, match="state is for other rungs or brackets"):
            make_searcher(SPACE, s.config).load_state_dict(
                {k: v for k, v in state.items() if k != key}
            )
    with pytest.raises(ValueError, match="cannot load state of kind 'sha'"):
        make_searcher(SPACE, s.config).load_state_dict({**state, "kind": "sha"})


def test_corrupt_hyperband_and_sha_states_are_refused() -> None:
    h, state = _mid_run("hyperband", mode="conservative")
    assert isinstance(h, HyperbandSearcher) and len(h.brackets) > 1
    brackets = state["trials"]["bracket"]
    other = [b for b in range(len(h.brackets)) if b != brackets[0]][0]
    moved = _with(state, ("trials", "bracket"), [other, *brackets[1:]])
    with pytest.raises(ValueError, match="another bracket|paused without|grant or rung"):
        make_searcher(SPACE, h.config).load_state_dict(moved)
    s, state = _mid_run("sha")
    members = state["members"][0]
    for bad in (
        _with(state, ("members", 0), [*members, 30]),
        _with(state, ("members",), []),
        _with(state, ("members", 0), "B:AAAA"),
        _with(state, ("trials", "grant"), [7] * len(members)),
        _with(state, ("results", 0, "metrics"), ["x"]),
    ):
        with pytest.raises(ValueError, match="sha searcher: malformed state"):
            make_searcher(SPACE, s.config).load_state_dict(bad)


def test_restore_builds_no_trial_record_until_touched() -> None:
    s = make_searcher(SPACE, _cfg(name="asha", max_trials=500, seed=1))
    for op in s.ask(500):
        s.tell(op.request_id, 1, op.request_id % 7 / 10)
    restored = make_searcher(SPACE, s.config)
    restored.load_state_dict(_json(s))
    assert isinstance(restored, ASHASearcher)
    assert len(restored._trials) == 500 and not restored._trials._live
    work = restored.ask(3)
    assert work == s.ask(3) and len(restored._trials._live) == 3
    assert restored.state_dict() == s.state_dict() and not restored._trials._live
    table, combos = TrialTable.decode(_json(s)["trials"])
    assert len(table) == sum(combos.values()) == 500


def test_lengths_past_32_bits_round_trip() -> None:
    s = make_searcher(SPACE, _cfg(name="asha", max_trials=3, max_length=2**40, seed=1))
    (op,) = s.ask(1)
    s.tell(op.request_id, 2**35, 0.5)
    state = _json(s)
    assert state["trials"]["last_length"] == [2**35]
    restored = make_searcher(SPACE, s.config)
    restored.load_state_dict(state)
    assert restored.state_dict() == s.state_dict()


def test_the_state_is_plain_data() -> None:
    """Columns of numbers and names, non-finite metrics as strings: no codec, no version."""
    s = make_searcher(SPACE, _cfg(name="asha", max_trials=4, seed=2))
    ops = s.ask(3)
    for op, v in zip(ops, (math.nan, 0.25, -math.inf), strict=True):
        s.tell(op.request_id, 1, v)
    state = json.loads(state_json(s))
    assert "version" not in state
    assert state["trials"] == {
        "bracket": [0, 0, 0],
        "grant": [0, 0, 0],
        "resolved": [1, 1, 1],
        "last_length": [1, 1, 1],
        "status": ["paused", "paused", "paused"],
        "has_last": [True, True, True],
        "last_metric": ["nan", 0.25, "-inf"],
    }
    assert state["results"][0][0] == {"ids": [2, 1, 0], "metrics": ["-inf", 0.25, "nan"]}
