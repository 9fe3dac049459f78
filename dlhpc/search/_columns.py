"""The columns of the searchers' saved states, as plain JSON lists.

A saved state is strict JSON (no ``NaN`` or ``Infinity`` tokens). A column of
integers is a list of integers; a column of floats is a list of numbers with the
non-finite ones as the strings ``"nan"``, ``"inf"`` and ``"-inf"``. Every float
comes back as the same double (a JSON number is written as the shortest text that
reads back as it, by :mod:`json` and orjson alike: -0.0 and subnormals included); a
NaN comes back as NaN (its sign and payload bits are not kept: no searcher tells
NaNs apart).
"""

from __future__ import annotations

import math
import operator
from array import array
from collections.abc import Iterable
from itertools import compress, count
from typing import Any

__all__ = ["decode_floats", "decode_ints", "decode_metric", "encode_floats", "encode_metric"]

_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def encode_metric(value: float) -> float | str:
    """A float as JSON: itself when finite, else ``"nan"``, ``"inf"`` or ``"-inf"``."""
    return value if math.isfinite(value) else repr(value)


def decode_metric(value: Any) -> float:
    """Inverse of :func:`encode_metric`: a :class:`ValueError` or :class:`TypeError` for
    anything but a number or one of the three strings."""
    if isinstance(value, str):
        if value not in _NON_FINITE:
            raise ValueError(f"not a float: {value!r}")
        return _NON_FINITE[value]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"not a float: {value!r}")
    return float(value)


def encode_floats(values: Iterable[float]) -> list[float | str]:
    """A column of floats (:func:`encode_metric` of each; C loops but for the
    non-finite ones)."""
    out: list[Any] = list(values)  # floats, the non-finite ones then replaced by text
    for i in list(compress(count(), map(operator.not_, map(math.isfinite, out)))):
        out[i] = repr(out[i])
    return out


def decode_floats(data: Any) -> array[float]:
    """Inverse of :func:`encode_floats`, as doubles (a :class:`TypeError` for an item
    that is neither a number nor one of the three strings)."""
    if not isinstance(data, list):
        raise TypeError(f"expected a list of floats, got {type(data).__name__}")
    return array("d", map(_NON_FINITE.get, data, data))


def decode_ints(data: Any) -> array[int]:
    """A column of integers as 64-bit ones (a :class:`TypeError` for a non-integer, an
    :class:`OverflowError` for one out of range)."""
    if not isinstance(data, list):
        raise TypeError(f"expected a list of integers, got {type(data).__name__}")
    return array("q", data)
