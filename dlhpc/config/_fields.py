"""Checks shared by experiment and site files (signals, times, paths, env vars)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dlhpc.config._paths import expand_path
from dlhpc.config._units import parse_duration_s, parse_slurm_time
from dlhpc.config._validate import Check, Invalid, choice, describe, string

__all__ = [
    "ENV_NAME",
    "SIGNALS",
    "TOKEN",
    "env_vars",
    "json_value",
    "lead_time",
    "path",
    "signal",
    "slurm_time",
]

SIGNALS = ("USR1", "USR2", "TERM", "INT")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
TOKEN = string(token=True)  # partition, account, qos, ...; ends up on an #SBATCH line

signal = choice(
    *SIGNALS,
    normalize=lambda s: s.strip().upper().removeprefix("SIG"),
    hint=" (SIG prefix allowed)",
)


def lead_time(value: Any) -> int:
    """Seconds before the time limit at which the job is signalled: 1..65535 (Slurm's range)."""
    try:
        seconds = parse_duration_s(value)
    except ValueError as exc:
        raise Invalid(str(exc)) from None
    if not 1 <= seconds <= 65535:
        raise Invalid(f"must be between 1s and 65535s (Slurm's limit), got {describe(value)}")
    return seconds


def slurm_time(*, allow_unlimited: bool) -> Check:
    """A Slurm time limit -> ``(text as given, minutes or None for UNLIMITED)``."""

    def check(value: Any) -> tuple[str, int | None]:
        minutes: int | None
        try:
            if allow_unlimited:
                minutes = parse_slurm_time(value, allow_unlimited=True)
            else:
                minutes = parse_slurm_time(value)
        except ValueError as exc:
            raise Invalid(str(exc)) from None
        if minutes == 0 and not allow_unlimited:
            raise Invalid(f"must be at least one minute, got {describe(value)}")
        return str(value).strip(), minutes

    return check


def path(base: Path, environ: Mapping[str, str]) -> Check:
    """A path string: ``~`` and ``${VAR}`` expanded, made absolute against ``base``."""

    def check(value: Any) -> Path:
        if not isinstance(value, str):
            raise Invalid(f"must be a path (a string), got {describe(value)}")
        try:
            return expand_path(value, base, environ)
        except ValueError as exc:
            raise Invalid(str(exc)) from None

    return check


def env_vars(value: Any) -> dict[str, str]:
    """``{NAME: scalar}`` -> ``{NAME: str}``; booleans and null are refused (ambiguous)."""
    if not isinstance(value, dict):
        raise Invalid(f"must be a mapping of NAME: value, got {describe(value)}")
    out: dict[str, str] = {}
    errors: list[Invalid] = []
    for name, val in value.items():
        if not ENV_NAME.fullmatch(name):
            message = f"not a valid environment variable name: {describe(name)}"
            errors.append(Invalid(message, (name,)))
        elif isinstance(val, bool) or val is None:
            errors.append(
                Invalid(f"must be a string or a number, got {describe(val)} (quote it)", (name,))
            )
        elif isinstance(val, str) and "\0" in val:
            errors.append(Invalid("must not contain a NUL character", (name,)))
        elif isinstance(val, float) and not math.isfinite(val):
            errors.append(Invalid(f"must be a finite number, got {describe(val)}", (name,)))
        elif isinstance(val, (str, int, float)):
            out[name] = str(val)
        else:
            errors.append(Invalid(f"must be a string or a number, got {describe(val)}", (name,)))
    if errors:
        raise Invalid.merge(errors)
    return out


def json_value(value: Any) -> Any:
    """Any YAML/JSON value that survives a strict JSON round trip (no NaN or infinity)."""
    stack = [value]
    while stack:  # iterative: a deeply nested JSON file must not exhaust the stack
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise Invalid(f"must not contain NaN or infinity (JSON cannot hold it), got {item!r}")
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
    return value
