"""The saved state of the rung searchers (SHA, ASHA, Hyperband): format and trial table.

A long search restores its searcher and saves it again on every busy pass, so
the state holds its bulk (a row per trial, a result per trial and rung) as
columns, not as JSON rows: each column is a string ``"<typecode>:<base64>"`` of
a little-endian :class:`array.array`, integers in the smallest of ``B``, ``H``,
``I``, ``q`` that holds them (so the text depends only on the values), metrics
as ``d`` (IEEE doubles: NaN and the infinities round-trip exactly). Decoding
and encoding are C loops; the searcher builds a Python object only for the
trials a pass touches (:class:`TrialTable`).

Version 2 (this module's):

* ``trials``: the columns ``bracket``, ``grant``, ``resolved``, ``status``
  (the index in :data:`STATUS_CODES`), ``has_last`` (0 or 1), ``last_length``
  and ``last_metric``, indexed by request id;
* a rung's results: ``{"ids", "metrics"}`` columns (:func:`encode_results`),
  in the order the searcher gives (ASHA: best first, so that its ranking is
  checked, not sorted, on load: :func:`rank_order`).

Version 1 (JSON rows) still loads: :meth:`RungState.load_state_dict` has the
searcher upgrade it (:meth:`RungState._upgrade`) and loads the result. ASHA and
Hyperband's version 3 adds keys to version 2 (``spent``, the proposer's, and
Hyperband's ``allocation``); their versions 1 and 2 load the same way.
"""

from __future__ import annotations

import base64
import bisect
import math
import operator
import sys
from array import array
from collections import Counter
from collections.abc import Iterable, Mapping
from itertools import islice, repeat
from typing import Any, ClassVar

from dlhpc.search._rungs import (
    EXITED,
    FINISHED,
    PAUSED,
    RUNNING,
    STOPPING,
    RankKey,
    TrialRecord,
    decode_metric,
    rank_key,
    rung_lengths,
)

__all__ = [
    "STATUS_CODES",
    "RungState",
    "TrialTable",
    "decode_floats",
    "decode_ints",
    "decode_results",
    "encode_floats",
    "encode_ints",
    "encode_ranked",
    "encode_results",
    "rank_order",
    "rank_sorted",
    "results_dict",
    "results_from_rows",
]

#: Status codes in the ``status`` column: the index in this tuple.
STATUS_CODES = (RUNNING, PAUSED, FINISHED, STOPPING, EXITED)
_CODE = {status: code for code, status in enumerate(STATUS_CODES)}
_SIZES = {"B": 1, "H": 2, "I": 4, "q": 8, "d": 8}
# The integer typecodes, narrowest first; a platform whose C int is not 4 bytes never
# writes "I" (and refuses to read it: the bytes would be misread).
_INT_CODES = tuple(c for c in "BHIq" if array(c).itemsize == _SIZES[c])
_SWAP = sys.byteorder == "big"  # the stored bytes are little-endian

#: How many trials have each ``(bracket, grant, resolved, status)``.
Combos = Counter[tuple[int, int, int, str]]


def _encode(values: array[Any]) -> str:
    if _SWAP:
        values = array(values.typecode, values)
        values.byteswap()
    return f"{values.typecode}:{base64.b64encode(values.tobytes()).decode('ascii')}"


def _decode(text: Any, codes: Iterable[str]) -> array[Any]:
    if not isinstance(text, str) or text[1:2] != ":" or text[0] not in codes:
        raise ValueError(f"not a column of typecode {'/'.join(codes)}: {str(text)[:20]!r}")
    values = array(text[0])
    values.frombytes(base64.b64decode(text[2:], validate=True))
    if _SWAP:
        values.byteswap()
    return values


def encode_ints(values: Iterable[int]) -> str:
    """Integers as a column, in the narrowest typecode that holds them all."""
    wide = values if isinstance(values, array) else array("q", values)
    for code in _INT_CODES[: _INT_CODES.index(wide.typecode)]:
        try:
            return _encode(array(code, wide))
        except OverflowError:
            continue
    return _encode(wide)


def decode_ints(text: Any) -> array[int]:
    """Inverse of :func:`encode_ints` (the array keeps the stored typecode)."""
    return _decode(text, _INT_CODES)


def encode_floats(values: Iterable[float]) -> str:
    """Floats as a column of IEEE doubles (NaN and the infinities round-trip exactly)."""
    return _encode(array("d", values))


def decode_floats(text: Any) -> array[float]:
    """Inverse of :func:`encode_floats`."""
    return _decode(text, "d")


def encode_results(order: Iterable[int], results: Mapping[int, float]) -> dict[str, str]:
    """A rung's ``results`` (request id -> metric) as columns, the ids in ``order``."""
    ids = array("q", order)
    return {"ids": encode_ints(ids), "metrics": _encode(array("d", map(results.__getitem__, ids)))}


def encode_ranked(
    keys: list[RankKey], results: Mapping[int, float], smaller_is_better: bool
) -> dict[str, str]:
    """:func:`encode_results` of a rung kept as rank keys (ASHA's), best first: the
    inverse of :func:`rank_order`. The finite metrics come from the keys (negated
    back when larger is better: exact), the NaN ones from ``results``."""
    finite = bisect.bisect_left(keys, (1, -math.inf, -1))  # before the first NaN's key
    ids = array("q", map(operator.itemgetter(2), keys))
    head = map(operator.itemgetter(1), islice(keys, finite))
    metrics = array("d", head if smaller_is_better else map(operator.neg, head))
    metrics.extend(map(results.__getitem__, islice(ids, finite, None)))
    return {"ids": encode_ints(ids), "metrics": _encode(metrics)}


def decode_results(data: Any, trials: int) -> tuple[array[int], array[float]]:
    """The ``(ids, metrics)`` columns of :func:`encode_results`; every id below ``trials``."""
    if not isinstance(data, dict):
        raise TypeError("rung results: expected {'ids', 'metrics'}")
    ids, metrics = decode_ints(data["ids"]), _decode(data["metrics"], "d")
    if len(ids) != len(metrics):
        raise ValueError("rung results: ids and metrics differ in length")
    # an unsigned column holds no negative id: min() only for "q"
    if ids and (max(ids) >= trials or (ids.typecode == "q" and min(ids) < 0)):
        raise ValueError("a rung result names a request never created")
    return ids, metrics


def results_dict(ids: array[int], metrics: array[float]) -> dict[int, float]:
    """``request id -> metric``; a :class:`ValueError` when an id comes twice."""
    out = dict(zip(ids, metrics, strict=True))
    if len(out) != len(ids):
        raise ValueError("a request has two results in one rung")
    return out


def results_from_rows(rows: Any) -> dict[int, float]:
    """Version 1's rung rows ``[[request id, metric], ...]`` (a later row wins, as then)."""
    return {int(rid): decode_metric(v) for rid, v in rows}


def rank_sorted(results: Mapping[int, float], smaller_is_better: bool) -> list[int]:
    """The request ids of ``results``, best first (:func:`~dlhpc.search._rungs.rank_key`)."""
    return sorted(results, key=lambda rid: rank_key(results[rid], rid, smaller_is_better))


def rank_order(ids: array[int], metrics: array[float], smaller_is_better: bool) -> list[RankKey]:
    """The rank keys of a rung's results given best first (as :func:`rank_sorted` orders
    them), built and checked in C loops: a :class:`ValueError` unless they are strictly
    increasing, i.e. the stored order is the ranking (NaN last, ties by request id)."""
    nans = sum(map(math.isnan, metrics))
    finite = len(ids) - nans
    if not all(map(math.isnan, islice(metrics, finite, None))):
        raise ValueError("rung results are not in rank order (NaN must come last)")
    head = islice(metrics, finite)
    signed = head if smaller_is_better else map(operator.neg, head)
    keys: list[RankKey] = list(zip(repeat(0, finite), signed, islice(ids, finite), strict=True))
    keys += zip(repeat(1), repeat(0.0), islice(ids, finite, None), strict=False)
    if not all(map(operator.lt, keys, islice(keys, 1, None))):
        raise ValueError("rung results are not in rank order")
    return keys


class TrialTable:
    """The trials of a rung searcher by request id (``0 .. len - 1``), as columns.

    ``table[rid]`` is the trial's :class:`~dlhpc.search._rungs.TrialRecord`,
    built on first access and kept, so the searcher reads and changes it in
    place; :meth:`flush` (and so :meth:`encode`) writes the records back and
    drops them: a record is valid until the next flush. A restored search of
    100,000 trials so builds records only for those a pass touches. Lengths are
    64-bit integers, as the database stores steps (a longer one cannot be saved).
    """

    _INTS = ("bracket", "grant", "resolved", "status", "has_last", "last_length")

    def __init__(self, columns: dict[str, array[Any]] | None = None) -> None:
        self._cols: dict[str, array[Any]] = columns or {name: array("B") for name in self._INTS}
        self._cols.setdefault("last_metric", array("d"))
        self._live: dict[int, TrialRecord] = {}

    @classmethod
    def from_rows(cls, rows: Any) -> TrialTable:
        """Version 1's trial rows (:meth:`~dlhpc.search._rungs.TrialRecord.from_row`)."""
        table = cls()
        for row in rows:
            table.append(TrialRecord.from_row(row))
        table.flush()
        return table

    @classmethod
    def decode(cls, data: Any) -> tuple[TrialTable, Combos]:
        """Inverse of :meth:`encode`, and how many trials have each ``(bracket, grant,
        resolved, status)``; a :class:`ValueError` (or ``KeyError``/``TypeError``) when
        a column is missing or malformed, their lengths differ or a status or
        ``has_last`` code is unknown."""
        if not isinstance(data, dict):
            raise TypeError("trials: expected the table of columns")
        cols = {name: decode_ints(data[name]) for name in cls._INTS}
        cols["last_metric"] = _decode(data["last_metric"], "d")
        if len({len(c) for c in cols.values()}) != 1:
            raise ValueError("trials: the columns differ in length")
        keys = ("bracket", "grant", "resolved", "status", "has_last")
        combos: Combos = Counter()
        for (b, g, r, s, last), n in Counter(zip(*(cols[k] for k in keys), strict=True)).items():
            if not (0 <= s < len(STATUS_CODES) and last in (0, 1)):
                raise ValueError("trials: unknown status or has_last code")
            combos[b, g, r, STATUS_CODES[s]] += n
        return cls(cols), combos

    def encode(self) -> dict[str, str]:
        """The columns (after :meth:`flush`), as the state's ``trials``."""
        self.flush()
        out = {name: encode_ints(self._cols[name]) for name in self._INTS}
        out["last_metric"] = _encode(self._cols["last_metric"])
        return out

    def __len__(self) -> int:
        return len(self._cols["status"])

    def __getitem__(self, rid: int) -> TrialRecord:
        t = self._live.get(rid)
        if t is None:
            c = self._cols
            last = (c["last_length"][rid], c["last_metric"][rid]) if c["has_last"][rid] else None
            status = STATUS_CODES[c["status"][rid]]
            t = TrialRecord(c["bracket"][rid], c["grant"][rid], status, c["resolved"][rid], last)
            self._live[rid] = t
        return t

    def append(self, t: TrialRecord) -> None:
        """Add trial ``len(self)``."""
        self._live[len(self)] = t
        for col in self._cols.values():
            col.append(0)

    def flush(self) -> None:
        """Write the records handed out back into the columns, and drop them."""
        for rid, t in self._live.items():
            last = t.last or (0, 0.0)
            self._put("bracket", rid, t.bracket)
            self._put("grant", rid, t.grant)
            self._put("resolved", rid, t.resolved)
            self._put("status", rid, _CODE[t.status])
            self._put("has_last", rid, t.last is not None)
            self._put("last_length", rid, last[0])
            self._cols["last_metric"][rid] = last[1]
        self._live.clear()

    def _put(self, name: str, rid: int, value: int) -> None:
        try:
            self._cols[name][rid] = value
        except OverflowError:  # widen the column (decoded narrow, or a new trial's)
            self._cols[name] = array("q", self._cols[name])
            self._cols[name][rid] = value

    def first(self, bracket: int, grant: int, resolved: int, status: str) -> int:
        """The first request id with these values (for error messages)."""
        self.flush()
        c, wanted = self._cols, (bracket, grant, resolved, _CODE[status])
        rows = zip(c["bracket"], c["grant"], c["resolved"], c["status"], strict=True)
        return next(rid for rid, row in enumerate(rows) if row == wanted)

    def pause_marks(self) -> list[int]:
        """Per request id: its grant plus one when it is paused, else 0."""
        self.flush()
        c = self._cols
        paused = map(_CODE[PAUSED].__eq__, c["status"])
        return list(map(operator.mul, paused, map(operator.add, c["grant"], repeat(1))))

    def in_bracket(self, ids: Iterable[int], bracket: int) -> bool:
        """Whether every trial of ``ids`` is in ``bracket``."""
        self.flush()
        return all(map(bracket.__eq__, map(self._cols["bracket"].__getitem__, ids)))


class RungState:
    """``state_dict`` / ``load_state_dict`` of the SHA and ASHA searchers (a mixin).

    The state is ``kind``, ``version``, the keys of :meth:`_fingerprint` (the
    config the state belongs to), the trials (:class:`TrialTable`), then the
    searcher's own part (:meth:`_state`). A state of another kind or version,
    or for another config (for other :attr:`_other`, the error says), raises
    :class:`ValueError`; so does a malformed one, after :meth:`_reset`. A state
    of an older version is upgraded (:meth:`_upgrade`) and loaded.
    """

    kind: ClassVar[str]
    state_version: ClassVar[int]
    _trials: TrialTable
    # The settings rules the rung searchers share (see dlhpc.search.base).
    options: ClassVar[frozenset[str]] = frozenset({"min_length", "stop_once"})
    learns: ClassVar[bool] = True
    _other = "rungs"

    @classmethod
    def rung_plan(cls, settings: Mapping[str, Any]) -> tuple[int, ...]:
        """The rung lengths of the stored ``searcher`` section (``()`` when malformed)."""
        try:
            lengths = rung_lengths(
                int(settings.get("max_length", 1)),
                int(settings.get("divisor", 3)),
                int(settings.get("max_rungs", 5)),
                int(settings.get("min_length") or 1),
            )
        except (TypeError, ValueError):
            return ()
        return tuple(lengths)

    def _fingerprint(self) -> dict[str, Any]:
        raise NotImplementedError

    def _state(self) -> dict[str, Any]:
        raise NotImplementedError

    def _load(self, state: dict[str, Any]) -> None:
        raise NotImplementedError

    def _upgrade(self, state: dict[str, Any]) -> dict[str, Any]:
        """A state of an older version (fingerprint checked) as this version's."""
        raise NotImplementedError

    def _reset(self) -> None:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "version": self.state_version,
            **self._fingerprint(),
            "trials": self._trials.encode(),
            **self._state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        kind, version = self.kind, state.get("version")
        known = isinstance(version, int) and 1 <= version <= self.state_version
        if state.get("kind") != kind or not known:
            raise ValueError(
                f"{kind} searcher: cannot load state of kind {state.get('kind')!r} "
                f"version {version!r}"
            )
        mine = self._fingerprint()
        # settings newer than version 2 are in the fingerprint only when given
        optional = {k: mine.get(k) for k in ("max_budget", "proposer")}
        if any(state.get(k) != v for k, v in {**mine, **optional}.items()):
            raise ValueError(
                f"{kind} searcher: state is for other {self._other} "
                "(did the searcher config change?)"
            )
        try:
            self._load(state if version == self.state_version else self._upgrade(state))
        except (KeyError, TypeError, ValueError, IndexError, OverflowError) as exc:
            self._reset()
            raise ValueError(f"{kind} searcher: malformed state: {exc}") from exc
