"""The side-by-side tables of the compare page, as :class:`Row` lists (pure).

Every value is turned into the text the page shows here (:func:`shown`), so a row
differs exactly when its cells read differently. The record rows come from
:func:`dlhpc.repro.diff_records`: each side's record against the first side's; an
item that differs anywhere gets one row with every side's value (a side where it
did not differ shows the first side's value, which it equals).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from dlhpc.report._compare_data import Row, Side
from dlhpc.report._page import hp_value
from dlhpc.report._svg import fmt
from dlhpc.repro import SECTIONS, diff_records

__all__ = ["RECORD_SECTIONS", "hparam_rows", "record_rows", "shown", "space_text", "summary_rows"]

RECORD_SECTIONS = tuple(s for s in SECTIONS if s != "hparams")  # the table above has them
_SHA = re.compile(r"[0-9a-f]{64}")
_LONGEST = 120


def shown(value: Any) -> str:
    """A value as a table cell shows it: ``(none)`` for None, a sha256's first 12 hex
    digits, floats to 4 significant digits, structures as compact JSON; cut at 120."""
    if value is None:
        return "(none)"
    if isinstance(value, str):
        text = value[:12] if _SHA.fullmatch(value) else value
    elif isinstance(value, bool | int):
        text = str(value)
    elif isinstance(value, float):
        text = hp_value(value) if math.isfinite(value) else str(value)
    else:
        text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= _LONGEST else text[: _LONGEST - 1] + "…"


def space_text(spec: Any) -> str:
    """One hyperparameter's search space in a line: ``log 10^[-3, -1] (2 points)``,
    ``int [32, 64]``, ``categorical [32, 64, 128]``, ``const 0.1``."""
    if not isinstance(spec, Mapping):
        return shown(spec)
    kind = str(spec.get("type", "?"))
    count = f" ({spec['count']} points)" if spec.get("count") else ""
    if kind == "const":
        return f"const {shown(spec.get('value'))}"
    if kind == "categorical":
        return f"categorical {shown(list(spec.get('vals') or []))}"
    bounds = f"[{shown(spec.get('minval'))}, {shown(spec.get('maxval'))}]"
    if kind == "log":
        return f"log {shown(spec.get('base', 10.0))}^{bounds}{count}"
    return f"{kind} {bounds}{count}"


def summary_rows(sides: Sequence[Side], mode: str) -> list[Row]:
    """What each side is, and its result."""

    def row(name: str, values: Sequence[str]) -> Row:
        return Row("summary", name, tuple(values))

    rows = [
        row("experiment", [f"{s.experiment_id}: {s.experiment_name}" for s in sides]),
        row(
            "metric",
            [
                f"{s.metric} ({'smaller' if s.smaller_is_better else 'larger'} is better)"
                for s in sides
            ],
        ),
        row("searcher", [s.searcher for s in sides]),
        row("state", [s.state for s in sides]),
    ]
    if mode == "experiments":
        rows.append(row("trials", [str(len(s.trials)) for s in sides]))
        rows.append(row("best trial", [f"trial {s.best.id}" if s.best else "-" for s in sides]))
    rows.append(row("best result", [fmt(s.best.best, 6) if s.best else "-" for s in sides]))
    rows.append(row("steps", [str(s.best.steps) if s.best else "-" for s in sides]))
    if mode == "trials":
        rows.append(row("latest result", [fmt(s.trials[0].latest, 6) for s in sides]))
    return rows


def hparam_rows(sides: Sequence[Side], mode: str) -> list[Row]:
    """Experiments: each hyperparameter's space and the best trial's value; trials:
    each trial's value (``-``: the side has no such hyperparameter)."""
    names = sorted(
        {
            *(n for s in sides for n in s.space),
            *(n for s in sides for t in s.trials for n in t.hparams),
        }
    )
    rows = []
    for name in names:
        if mode == "experiments":
            rows.append(
                Row(
                    "space",
                    name,
                    tuple(space_text(s.space[name]) if name in s.space else "-" for s in sides),
                )
            )
            rows.append(
                Row(
                    "best trial",
                    name,
                    tuple(
                        shown(s.best.hparams[name]) if s.best and name in s.best.hparams else "-"
                        for s in sides
                    ),
                )
            )
        else:
            rows.append(
                Row(
                    "value",
                    name,
                    tuple(
                        shown(s.trials[0].hparams[name]) if name in s.trials[0].hparams else "-"
                        for s in sides
                    ),
                )
            )
    return rows


def record_rows(records: Sequence[Mapping[str, Any]], volatile: Collection[str] = ()) -> list[Row]:
    """The items that differ between the records, in :data:`RECORD_SECTIONS` order
    (first seen first within a section); ``volatile`` environment variables are not
    compared."""
    if not records:
        return []
    found: dict[tuple[str, str], list[Any]] = {}
    missing = object()
    for i, other in enumerate(records[1:], start=1):
        for d in diff_records(records[0], other, RECORD_SECTIONS, volatile):
            values = found.setdefault((d.section, d.item), [missing] * len(records))
            values[0], values[i] = d.a, d.b
    order = {s: i for i, s in enumerate(SECTIONS)}
    rows = []
    for (section, item), values in sorted(found.items(), key=lambda kv: order.get(kv[0][0], 99)):
        first = values[0]
        cells = tuple(shown(first if v is missing else v) for v in values)
        rows.append(Row(section, item, cells))
    return rows
