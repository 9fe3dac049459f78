"""Fuzzing ingest: whatever a job writes into its attempt folder, no exception escapes.

Inputs: event files of records of every kind ingest stores (``metric``, ``metrics``,
``start``, ``exit``, ``checkpoint``, ``log``, ``env``, ``gpu``) with values replaced by
random JSON (huge and non-finite numbers, strings, nesting), random lines and random
bytes. Each example is one new attempt folder ingested by the real
:func:`~dlhpc.store.ingest.ingest_attempt` on a real store, committed; every file
must then be marked ingested exactly once, a refused one with no records.

Bounded by default (``EXAMPLES``); ``pytest --long`` (or ``DLHPC_LONG=1``) runs
``LONG_FACTOR`` times as many.
"""

from __future__ import annotations

import copy
import json
from itertools import count
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from dlhpc.protocol import EventWriter, attempt_dir
from dlhpc.store import Attempt, IngestedFile, Store, Trial, utcnow
from dlhpc.store.ingest import ingest_attempt
from tests.unit._db import exp_and_trial

EXAMPLES = 60
LONG_FACTOR = 50

_ONE = "AQAAAAAAAAA="  # one int64 / float64, base64
VALID: list[dict[str, Any]] = [
    {"type": "metric", "time": 1.5, "step": 3, "metrics": {"loss": 0.5, "acc": None}},
    {"type": "metrics", "n": 1, "step": _ONE, "time_ns": _ONE, "values": {"loss": _ONE}},
    {"type": "start", "time": 1.0, "host": "n1", "pid": 7, "job_id": "1", "nodes": "n1"},
    {"type": "exit", "time": 2.0, "code": 0, "reason": "completed", "signal": None, "step": 3},
    {"type": "checkpoint", "time": 2.0, "step": 3, "path": "ckpt-3", "size": 10, "metric": 0.5},
    {"type": "log", "time": 2.0, "level": "info", "message": "hi"},
    {"type": "env", "time": 2.0, "rank": 0, "record": {"host": "n1", "gpu": {"n": 1}}},
    {"type": "gpu", "time": 2.0, "host": "n1", "gpus": [{"index": 0, "util": 50}]},
]

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.sampled_from(["abc", "x", _ONE, "AQ==", "\ud800", 10**400, -(10**400), 1e18, 2**63]),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=10,
)


def _text(record: Any) -> str:
    """``record`` as one line; a huge int or a lone surrogate as JSON text all the same."""
    return json.dumps(record, allow_nan=True, default=str)


@st.composite
def _mutant(draw: st.DrawFn) -> str:
    record = copy.deepcopy(draw(st.sampled_from(VALID)))
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from([*record, "type", "metrics", "values", "n"]))
        if draw(st.booleans()):
            record[key] = draw(_values)
        else:
            record.pop(key, None)
    return _text(record)


_lines = st.one_of(
    _mutant(),
    st.sampled_from([_text(r) for r in VALID]),
    _values.map(_text),
    st.text(max_size=30),
)
_files = st.one_of(
    st.lists(_lines, min_size=1, max_size=6).map(
        lambda ls: "\n".join(ls).encode("utf-8", "surrogatepass")
    ),
    st.binary(max_size=60),
)


def _fuzz(long_run: bool) -> settings:
    return settings(
        max_examples=EXAMPLES * LONG_FACTOR if long_run else EXAMPLES,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )


def test_no_exception_escapes_ingest(tmp_path: Path, long_run: bool) -> None:
    store = Store(tmp_path / "home")
    tid = exp_and_trial(store, tmp_path)
    keys = count()

    @_fuzz(long_run)
    @given(files=st.lists(_files, min_size=1, max_size=4))
    def ingest(files: list[bytes]) -> None:
        folder = attempt_dir(tmp_path / "t", f"{next(keys)}_0.r0")
        w = EventWriter(folder, "user-r0")
        for data in files:
            path = w.publish_text("x")  # the next name, then its bytes replaced
            assert path is not None
            path.write_bytes(data)
        with store.write() as s:
            trial = s.get(Trial, tid)
            assert trial is not None
            ingest_attempt(s, trial, folder, utcnow())
        with store.read() as s:
            marked = s.execute(
                select(IngestedFile.name)
                .join(Attempt, Attempt.id == IngestedFile.attempt_id)
                .where(Attempt.attempt_key == folder.name)
            ).scalars()
            assert sorted(marked) == sorted(p.name for p in folder.iterdir())

    try:
        ingest()
    finally:
        store.close()
