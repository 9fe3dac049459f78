"""The ``hyperparameters`` and ``searcher`` sections of an experiment.

A hyperparameter is a constant (any JSON-compatible value, including a
mapping without a ``type`` key) or a mapping with ``type`` ``const`` (``val``),
``int``/``double``/``log`` (``minval`` <= ``maxval``, optional grid ``count``;
``log`` bounds are exponents of ``base`` > 1, as in Determined) or
``categorical`` (non-empty ``vals``). The ``grid`` searcher needs ``count``
on every range.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, cast, get_args

from dlhpc.config._fields import json_value
from dlhpc.config._validate import (
    Field,
    Invalid,
    Issues,
    Section,
    boolean,
    choice,
    describe,
    integer,
    number,
    read_section,
    string,
)
from dlhpc.config.schema import HParam, HParamType, SearcherConfig
from dlhpc.config.searcher_rules import Report, SearcherRules, Searchers, default_concurrency

__all__ = ["read_hyperparameters", "read_searcher"]

_HP_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_TYPES: tuple[str, ...] = get_args(HParamType)
_EXACT_INT = 2**53  # int bounds are used as floats by the searchers
_MAX_GRID = 100_000  # the grid searcher's own limit (for hyperparameter counts)
_MAX_TRIALS = 1_000_000  # what one launch may ask the searcher for
_MAX_LENGTH = 10**12  # steps or epochs; far beyond any run, well inside SQLite's integers
_MAX_BUDGET = 10**15  # max_budget: max_length times a long search's trials


def _vals(value: Any) -> tuple[Any, ...]:
    if not isinstance(value, list) or not value:
        raise Invalid(f"must be a non-empty list of values, got {describe(value)}")
    return tuple(json_value(v) for v in value)


def _base(value: Any) -> float:
    result = cast(float, number()(value))
    if result <= 1:
        raise Invalid(f"must be a number > 1, got {describe(value)}")
    return result


_TYPE = Field(choice(*_TYPES), required=True)
_COUNT = Field(integer(min=1, max=_MAX_GRID), nullable=True)
_INT_BOUND = Field(integer(min=-_EXACT_INT, max=_EXACT_INT), required=True)
_NUM_BOUND = Field(number(), required=True)
_HP_FIELDS: dict[str, dict[str, Field]] = {
    "const": {"type": _TYPE, "val": Field(json_value, required=True)},
    "int": {"type": _TYPE, "minval": _INT_BOUND, "maxval": _INT_BOUND, "count": _COUNT},
    "double": {"type": _TYPE, "minval": _NUM_BOUND, "maxval": _NUM_BOUND, "count": _COUNT},
    "log": {
        "type": _TYPE,
        "minval": _NUM_BOUND,
        "maxval": _NUM_BOUND,
        "base": Field(_base, default=10.0),
        "count": _COUNT,
    },
    "categorical": {"type": _TYPE, "vals": Field(_vals, required=True)},
}


def read_hyperparameters(issues: Issues, value: Any) -> dict[str, HParam]:
    """Validate ``hyperparameters``; problems go to ``issues``, bad entries are left out."""
    path = ("hyperparameters",)
    if value is None:
        return {}
    if not isinstance(value, dict):
        issues.add(
            path, f"must be a mapping of name: value or name: {{type: ...}}, got {describe(value)}"
        )
        return {}
    out: dict[str, HParam] = {}
    for name, spec in value.items():
        here = (*path, name)
        if not _HP_NAME.fullmatch(name):
            issues.add(
                here,
                "not a valid hyperparameter name (letters, digits, _ . -; "
                "starting with a letter or _)",
            )
            continue
        if not isinstance(spec, dict) or "type" not in spec:
            try:
                out[name] = HParam(name, "const", value=json_value(spec))
            except Invalid as exc:
                issues.add(here, str(exc))
            continue
        kind = spec["type"]
        if kind not in _TYPES:
            issues.add(
                (*here, "type"),
                f"must be one of {', '.join(_TYPES)}, got {describe(kind)} (for a constant "
                "mapping that has a 'type' key, write {type: const, val: {...}})",
            )
            continue
        s = read_section(issues, spec, here, _HP_FIELDS[kind])
        if issues.ok(here):
            hparam = _build(issues, here, name, kind, s)
            if hparam is not None:
                out[name] = hparam
    return out


def _build(
    issues: Issues, here: tuple[str, ...], name: str, kind: str, s: Section
) -> HParam | None:
    if kind == "const":
        return HParam(name, "const", value=s["val"])
    if kind == "categorical":
        return HParam(name, "categorical", vals=s["vals"])
    lo, hi = s["minval"], s["maxval"]
    if lo > hi:
        issues.add((*here, "minval"), f"must be <= maxval ({describe(hi)}), got {describe(lo)}")
        return None
    if kind == "log":
        for key, exp in (("minval", lo), ("maxval", hi)):
            try:
                s["base"] ** exp
            except OverflowError:
                issues.add((*here, key), f"base ** {key} overflows a float, got {describe(exp)}")
                return None
    typed = cast(HParamType, kind)
    return HParam(name, typed, minval=lo, maxval=hi, base=s.get("base", 10.0), count=s["count"])


def _as_given(value: Any) -> Any:
    return value


def _proposer(value: Any) -> tuple[str, dict[str, Any]]:
    """``name`` or ``{name: ..., setting: ...}``: the name and the settings (the
    searcher's rules check both)."""
    if isinstance(value, str) and value:
        return value, {}
    if isinstance(value, dict) and isinstance(value.get("name"), str) and value["name"]:
        return value["name"], {k: json_value(v) for k, v in value.items() if k != "name"}
    raise Invalid(f"must be a proposer name or {{name: ..., settings}}, got {describe(value)}")


_SEARCHER_FIELDS = {
    "name": Field(_as_given, default="single"),  # checked by read_searcher
    "metric": Field(string(nonempty=True, single_line=True), default="val_loss"),
    "smaller_is_better": Field(boolean, default=True),
    "max_trials": Field(integer(min=1, cap=_MAX_TRIALS), nullable=True),
    "max_concurrent_trials": Field(integer(min=0, cap=_MAX_TRIALS), nullable=True),
    "max_length": Field(integer(min=1, cap=_MAX_LENGTH), nullable=True),
    "divisor": Field(integer(min=2, cap=_MAX_LENGTH), default=3),
    "max_rungs": Field(integer(min=1, cap=1000), nullable=True),
    "min_length": Field(integer(min=1, cap=_MAX_LENGTH), nullable=True),
    "stop_once": Field(boolean, default=False),
    "seed": Field(integer(min=0, max=2**32 - 1), default=0),
    "mode": Field(choice("aggressive", "standard", "conservative"), nullable=True),
    "proposer": Field(_proposer, nullable=True),
    "max_budget": Field(integer(min=1, cap=_MAX_BUDGET), nullable=True),
}


def read_searcher(
    issues: Issues, value: Any, space: Mapping[str, HParam], searchers: Searchers
) -> SearcherConfig:
    """Validate ``searcher`` (``space``: the valid hyperparameters, for the searcher's rules).

    The fields every searcher shares are checked here; then the searcher that
    ``searchers`` finds by name applies its own rules
    (:class:`~dlhpc.config.searcher_rules.SearcherRules`), reporting to ``issues``.
    """
    path = ("searcher",)
    s = read_section(issues, value, path, _SEARCHER_FIELDS)
    rules = _rules(issues, s["name"], searchers)
    name = rules.kind
    max_length = s["max_length"]
    if max_length is None:
        if rules.default_max_length is not None:
            max_length = rules.default_max_length
        elif issues.ok((*path, "name"), (*path, "max_length")):
            issues.add((*path, "max_length"), f"required for searcher {name!r}")
    _check_options(issues, s, rules, searchers)
    max_rungs, min_length = s["max_rungs"], s["min_length"]
    if max_rungs is not None and min_length is not None:
        issues.add((*path, "min_length"), "give 'max_rungs' or 'min_length', not both")
    if min_length is not None and max_length is not None and min_length > max_length:
        issues.add((*path, "min_length"), f"must be <= max_length ({max_length}), got {min_length}")
    if max_rungs is None:
        max_rungs = 5
        if min_length is not None and max_length is not None and min_length <= max_length:
            max_rungs = _rungs_between(min_length, max_length, s["divisor"] or 2)
    given = s["max_concurrent_trials"]
    max_trials = s["max_trials"]
    if max_trials is None:  # a budget ends the search: no count unless one is given
        max_trials = 1 if s["max_budget"] is None else _MAX_TRIALS
    proposer, proposer_settings = s["proposer"] or (None, {})
    config = SearcherConfig(
        name=name,
        metric=s["metric"],
        smaller_is_better=s["smaller_is_better"],
        max_trials=max_trials,
        max_concurrent_trials=given if given is not None else default_concurrency(rules),
        max_length=max_length if max_length is not None else 1,
        divisor=s["divisor"],
        max_rungs=max_rungs,
        seed=s["seed"],
        mode=s["mode"],
        min_length=min_length,
        stop_once=bool(s["stop_once"]),
        proposer=proposer,
        proposer_settings=proposer_settings,
        max_budget=s["max_budget"],
    )
    return rules.check_settings(config, space, issues)


class _Unchecked:
    """Stands in for a searcher that could not be found, so that the shared fields
    still get checked (the name's problem is reported; nothing else is added)."""

    default_max_length: int | None = 1
    options: frozenset[str] = frozenset()
    learns: bool = False

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def check_settings(
        self, config: SearcherConfig, space: Mapping[str, HParam], report: Report
    ) -> SearcherConfig:
        return config


def _rules(issues: Issues, name: Any, searchers: Searchers) -> SearcherRules:
    """The rules of the searcher ``name`` (a problem with the name is reported at
    ``searcher.name``, and a stand-in is returned)."""
    path = ("searcher", "name")
    if not issues.ok(path):
        return _Unchecked("single")
    try:
        rules = searchers.rules(name) if isinstance(name, str) else None
        if rules is not None:
            return rules
        issues.add(path, f"must be one of {', '.join(searchers.names())}, got {describe(name)}")
    except ValueError as exc:  # an installed searcher that is broken
        issues.add(path, str(exc))
    return _Unchecked(name if isinstance(name, str) else "single")


def _check_options(issues: Issues, s: Section, rules: SearcherRules, searchers: Searchers) -> None:
    """Refuse the optional keys (``mode``, ``min_length``, ``stop_once``) the searcher
    does not know, naming the searchers that do."""
    path = ("searcher",)
    if not issues.ok((*path, "name")):
        return
    for key in ("mode", "min_length", "stop_once", "proposer", "max_budget"):
        given = s[key] is not None and s[key] is not False
        if given and key not in rules.options:
            known = _knowing(searchers, key)
            quoted = ", ".join(repr(n) for n in known)
            takers = f"searcher {quoted}" if len(known) == 1 else f"searchers {quoted}"
            issues.add((*path, key), f"only applies to {takers}, not {rules.kind!r}")


def _knowing(searchers: Searchers, option: str) -> list[str]:
    """The searchers whose ``options`` include ``option``, in :meth:`Searchers.names`
    order; one that fails to load is left out (asking for it by name reports why)."""
    out = []
    for name in searchers.names():
        try:
            rules = searchers.rules(name)
        except ValueError:
            continue
        if rules is not None and option in rules.options:
            out.append(name)
    return out


def _rungs_between(min_length: int, max_length: int, divisor: int) -> int:
    """Rungs from ``min_length`` up to ``max_length``, each ``divisor`` times the last."""
    rungs, length = 1, max_length
    while length // divisor >= min_length:
        length //= divisor
        rungs += 1
    return rungs
