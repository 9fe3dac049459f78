"""The saved state of the rung searchers (SHA, ASHA, Hyperband): layout and trial table.

A long search restores its searcher and saves it again on every busy pass, so
the state holds its bulk (a row per trial, a result per trial and rung) as
plain JSON columns (:mod:`dlhpc.search._columns`), not as rows: decoding a column
is one C loop into an :class:`array.array`, and the searcher builds a Python
object only for the trials a pass touches (:class:`TrialTable`).

* ``trials``: the columns ``bracket``, ``grant``, ``resolved``, ``status`` (one
  of :data:`STATUS_CODES`), ``has_last`` (booleans), ``last_length`` and
  ``last_metric``, indexed by request id;
* a rung's results: ``{"ids", "metrics"}`` (:func:`encode_results`), in the
  order the searcher gives (ASHA: best first, so that its ranking is checked,
  not sorted, on load: :func:`rank_order`).
"""

from __future__ import annotations

import bisect
import math
import operator
from array import array
from collections import Counter
from collections.abc import Iterable, Mapping
from itertools import islice, repeat
from typing import Any, ClassVar

from dlhpc.search._columns import decode_floats, decode_ints, encode_floats
from dlhpc.search._rungs import (
    EXITED,
    FINISHED,
    PAUSED,
    RUNNING,
    STOPPING,
    RankKey,
    TrialRecord,
    rung_lengths,
)

__all__ = [
    "STATUS_CODES",
    "RungState",
    "TrialTable",
    "decode_results",
    "encode_ranked",
    "encode_results",
    "rank_order",
    "results_dict",
]

#: The statuses a trial can have; in memory, a status is its index in this tuple.
STATUS_CODES = (RUNNING, PAUSED, FINISHED, STOPPING, EXITED)
_CODE = {status: code for code, status in enumerate(STATUS_CODES)}
_UNKNOWN = len(STATUS_CODES)  # the code of a stored status that is none of them

#: How many trials have each ``(bracket, grant, resolved, status)``.
Combos = Counter[tuple[int, int, int, str]]


def encode_results(order: Iterable[int], results: Mapping[int, float]) -> dict[str, list[Any]]:
    """A rung's ``results`` (request id -> metric) as columns, the ids in ``order``."""
    ids = list(order)
    return {"ids": ids, "metrics": encode_floats(map(results.__getitem__, ids))}


def encode_ranked(
    keys: list[RankKey], results: Mapping[int, float], smaller_is_better: bool
) -> dict[str, list[Any]]:
    """:func:`encode_results` of a rung kept as rank keys (ASHA's), best first: the
    inverse of :func:`rank_order`. The non-NaN metrics come from the keys (negated
    back when larger is better: exact), the NaN ones from ``results``."""
    finite = bisect.bisect_left(keys, (1, -math.inf, -1))  # before the first NaN's key
    ids = list(map(operator.itemgetter(2), keys))
    head = map(operator.itemgetter(1), islice(keys, finite))
    metrics = encode_floats(head if smaller_is_better else map(operator.neg, head))
    metrics += encode_floats(map(results.__getitem__, islice(ids, finite, None)))
    return {"ids": ids, "metrics": metrics}


def decode_results(data: Any, trials: int) -> tuple[array[int], array[float]]:
    """The ``(ids, metrics)`` columns of :func:`encode_results`; every id below ``trials``."""
    if not isinstance(data, dict):
        raise TypeError("rung results: expected {'ids', 'metrics'}")
    ids, metrics = decode_ints(data["ids"]), decode_floats(data["metrics"])
    if len(ids) != len(metrics):
        raise ValueError("rung results: ids and metrics differ in length")
    if ids and (max(ids) >= trials or min(ids) < 0):
        raise ValueError("a rung result names a request never created")
    return ids, metrics


def results_dict(ids: array[int], metrics: array[float]) -> dict[int, float]:
    """``request id -> metric``; a :class:`ValueError` when an id comes twice."""
    out = dict(zip(ids, metrics, strict=True))
    if len(out) != len(ids):
        raise ValueError("a request has two results in one rung")
    return out


def rank_order(ids: array[int], metrics: array[float], smaller_is_better: bool) -> list[RankKey]:
    """The rank keys (:func:`~dlhpc.search._rungs.rank_key`) of a rung's results given
    best first, built and checked in C loops: a :class:`ValueError` unless they are
    strictly increasing, i.e. the stored order is the ranking (NaN last, ties by id)."""
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

    _INTS = ("bracket", "grant", "resolved", "last_length")

    def __init__(self, columns: dict[str, array[Any]] | None = None) -> None:
        self._cols: dict[str, array[Any]] = columns or {
            **{name: array("q") for name in self._INTS},
            "status": array("B"),
            "has_last": array("B"),
            "last_metric": array("d"),
        }
        self._live: dict[int, TrialRecord] = {}

    @classmethod
    def decode(cls, data: Any) -> tuple[TrialTable, Combos]:
        """Inverse of :meth:`encode`, and how many trials have each ``(bracket, grant,
        resolved, status)``; a :class:`ValueError` (or ``KeyError``/``TypeError``/
        ``OverflowError``) when a column is missing or malformed, their lengths differ
        or a status or ``has_last`` is unknown."""
        if not isinstance(data, dict):
            raise TypeError("trials: expected the table of columns")
        cols: dict[str, array[Any]] = {name: decode_ints(data[name]) for name in cls._INTS}
        if not isinstance(data["status"], list):
            raise TypeError("trials: expected a list of statuses")
        cols["status"] = array("B", map(_CODE.get, data["status"], repeat(_UNKNOWN)))
        cols["has_last"] = array("B", decode_ints(data["has_last"]))
        cols["last_metric"] = decode_floats(data["last_metric"])
        if len({len(c) for c in cols.values()}) != 1:
            raise ValueError("trials: the columns differ in length")
        keys = ("bracket", "grant", "resolved", "status", "has_last")
        combos: Combos = Counter()
        for (b, g, r, s, last), n in Counter(zip(*(cols[k] for k in keys), strict=True)).items():
            if s == _UNKNOWN or last not in (0, 1):
                raise ValueError("trials: unknown status or has_last")
            combos[b, g, r, STATUS_CODES[s]] += n
        return cls(cols), combos

    def encode(self) -> dict[str, list[Any]]:
        """The columns (after :meth:`flush`), as the state's ``trials``."""
        self.flush()
        c = self._cols
        return {
            **{name: c[name].tolist() for name in self._INTS},
            "status": list(map(STATUS_CODES.__getitem__, c["status"])),
            "has_last": list(map(bool, c["has_last"])),
            "last_metric": encode_floats(c["last_metric"]),
        }

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
        c = self._cols
        for rid, t in self._live.items():
            last = t.last or (0, 0.0)
            c["bracket"][rid], c["grant"][rid], c["resolved"][rid] = t.bracket, t.grant, t.resolved
            c["status"][rid], c["has_last"][rid] = _CODE[t.status], t.last is not None
            c["last_length"][rid], c["last_metric"][rid] = last
        self._live.clear()

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

    The state is ``kind``, the keys of :meth:`_fingerprint` (the config the
    state belongs to), the trials (:class:`TrialTable`), then the searcher's own
    part (:meth:`_state`). A state of another kind, or for another config (for
    other :attr:`_other`, the error says), raises :class:`ValueError`; so does a
    malformed one, after :meth:`_reset`.
    """

    kind: ClassVar[str]
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

    def _reset(self) -> None:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            **self._fingerprint(),
            "trials": self._trials.encode(),
            **self._state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        kind = self.kind
        if state.get("kind") != kind:
            raise ValueError(f"{kind} searcher: cannot load state of kind {state.get('kind')!r}")
        if any(state.get(k, ...) != v for k, v in self._fingerprint().items()):
            raise ValueError(
                f"{kind} searcher: state is for other {self._other} "
                "(did the searcher config change?)"
            )
        try:
            self._load(state)
        except (KeyError, TypeError, ValueError, IndexError, OverflowError) as exc:
            self._reset()
            raise ValueError(f"{kind} searcher: malformed state: {exc}") from exc
