"""The GPU rules both sides share: loading NVML and when a GPU counts as idle.

Jobs sample GPUs (:mod:`dlhpc.harness.telemetry`) into ``gpu`` event records;
the reconciler, ``dlhpc status`` and the report judge idleness with the rule
here, so the thresholds live in one place. Standard library only (``pynvml`` is
imported lazily by :func:`load_nvml`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = [
    "IDLE_BELOW_PCT",
    "IDLE_WINDOW_S",
    "digest",
    "idle_gpus",
    "idle_series",
    "idle_since",
    "is_busy",
    "load_nvml",
]

IDLE_BELOW_PCT = 10.0  # a GPU is idle below this utilization (percent) ...
IDLE_WINDOW_S = 600.0  # ... in every sample of this trailing window


def load_nvml() -> tuple[Any, str]:
    """(the initialised ``pynvml`` module, "") or (None, why not)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as err:  # ImportError, NVMLError (no driver), OSError (no library)
        return None, f"{type(err).__name__}: {err}"
    return pynvml, ""


def is_busy(util: float | None, below_pct: float = IDLE_BELOW_PCT) -> bool:
    """Whether a sample breaks idleness: at or above ``below_pct``, or with no utilization."""
    return util is None or util >= below_pct


def digest(
    series: Iterable[tuple[float, float | None]], below_pct: float = IDLE_BELOW_PCT
) -> tuple[float, float, float | None]:
    """(first, newest, last busy) sample time of a non-empty (time, util) series; the
    last busy time is None when no sample was busy (see :func:`is_busy`)."""
    points = list(series)
    busy = [t for t, u in points if is_busy(u, below_pct)]
    return (
        min(t for t, _ in points),
        max(t for t, _ in points),
        max(busy) if busy else None,
    )


def idle_since(
    first: float,
    newest: float,
    last_busy: float | None,
    now: float,
    window_s: float = IDLE_WINDOW_S,
) -> float | None:
    """The idle rule, on a GPU's :func:`digest`: when it went idle (its last busy sample,
    else its first sample), or None if it is not idle at ``now``. Idle means every sample
    in the window ``[now - window_s, now]`` was below the threshold, the samples cover
    the whole window (the first is at or before its start) and at least one falls in it
    (a GPU that stopped reporting is unknown, not idle)."""
    start = now - window_s
    if first > start or newest < start:
        return None
    if last_busy is not None and last_busy >= start:
        return None
    return first if last_busy is None else last_busy


def idle_series(
    series: Iterable[tuple[float, float | None]],
    now: float | None = None,
    below_pct: float = IDLE_BELOW_PCT,
    window_s: float = IDLE_WINDOW_S,
) -> float | None:
    """:func:`idle_since` of one GPU's (time, util) series, judged at ``now`` (default:
    its newest sample); None for an empty series."""
    points = list(series)
    if not points:
        return None
    first, newest, last_busy = digest(points, below_pct)
    return idle_since(first, newest, last_busy, newest if now is None else now, window_s)


def idle_gpus(
    records: Iterable[dict[str, Any]],
    below_pct: float = IDLE_BELOW_PCT,
    window_s: float = IDLE_WINDOW_S,
) -> list[tuple[str, int]]:
    """(host, index) of every GPU whose utilization stayed below ``below_pct`` in every
    sample of the last ``window_s`` seconds before its newest sample (the samples must
    cover the whole window). ``records`` are ``gpu`` event records, in any order."""
    samples: dict[tuple[str, int], list[tuple[float, float | None]]] = {}
    for rec in records:
        if rec.get("type") != "gpu":
            continue
        for gpu in rec.get("gpus", []):
            key = (str(rec.get("host", "")), int(gpu["index"]))
            samples.setdefault(key, []).append((float(rec["time"]), gpu.get("util")))
    return [
        key
        for key, series in sorted(samples.items())
        if idle_series(series, None, below_pct, window_s) is not None
    ]
