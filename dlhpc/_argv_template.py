"""Entrypoint templates: ``python train.py --lr {lr}`` filled into an argv, never a shell.

One definition for both sides: the config loader validates a template (its
placeholders, its shell syntax) and the in-job script runner
(:mod:`dlhpc.integrations.script`) fills it. Standard library only.

Contract:

* A placeholder is ``{name}`` with ``name`` a Python identifier, not preceded by
  ``$`` (so a shell line's ``${HOME}`` is no placeholder). ``{{`` and ``}}`` are
  literal braces; any other brace stays as written.
* An entrypoint is a *template* when it holds at least one placeholder.
* A template is split with :func:`shlex.split` (POSIX rules) *before* any value
  is filled in, so each token is one argv item whatever the values hold (spaces,
  quotes, ``$(...)``, ``;``); a token like ``--lr={lr}`` is one item with the value
  substituted in place.
* Values are formatted by :func:`format_value`: a float by :func:`repr` (the
  shortest text that reads back to the same float: ``0.001``, ``1e-05``), an int,
  a bool (``True``/``False``) or a string by :func:`str`, ``None`` as the empty
  string, a list or mapping as compact JSON.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "DLHPC_NAMES",
    "fill",
    "format_value",
    "is_template",
    "placeholders",
    "shell_syntax",
    "split_template",
]

#: Names dlhpc fills itself, beside the hyperparameters (see docs/USER_GUIDE.md).
DLHPC_NAMES: dict[str, str] = {
    "trial_id": "the trial's id",
    "experiment_id": "the experiment's id",
    "seed": "the trial's seed",
    "max_length": "the length granted (e.g. epochs; ASHA raises it on promotion)",
    "checkpoint_dir": "the folder the script writes its checkpoints into",
    "checkpoint": "the latest complete checkpoint to resume from; empty on a first run",
    "metrics_file": "the JSON-lines file the script may write metrics to",
}

_TOKEN = re.compile(r"\{\{|\}\}|(?<!\$)\{([A-Za-z_][A-Za-z0-9_]*)\}")
_OPERATORS = frozenset({"|", "||", "&", "&&", ";", ";;", ">", ">>", "<", "<<", "2>", "2>&1", "&>"})


def placeholders(template: str) -> list[str]:
    """The placeholder names of ``template``, in order of appearance (repeats kept)."""
    return [m[1] for m in _TOKEN.finditer(template) if m[1] is not None]


def is_template(entrypoint: str) -> bool:
    """True when ``entrypoint`` holds a placeholder (it then runs without a shell)."""
    return bool(placeholders(entrypoint))


def split_template(template: str) -> list[str]:
    """The template's tokens (:func:`shlex.split`); ValueError on unbalanced quotes."""
    tokens = shlex.split(template, comments=False, posix=True)
    if not tokens:
        raise ValueError("the entrypoint has no command")
    return tokens


def shell_syntax(tokens: Sequence[str]) -> str | None:
    """Why ``tokens`` look like shell syntax that a template cannot run, or None.

    A template runs without a shell: operators (``|``, ``&&``, ``;``, redirections)
    and ``$`` expansions would reach the program as literal arguments."""
    for token in tokens:
        if token in _OPERATORS:
            return f"{token!r} is shell syntax"
        if "$" in token or "`" in token:
            return f"{token!r} expands nothing without a shell"
    return None


def format_value(value: Any) -> str:
    """One argv item's text for a hyperparameter or dlhpc value (see the module doc)."""
    if value is None:
        return ""
    if isinstance(value, bool | int | str):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def fill(tokens: Sequence[str], values: Mapping[str, Any]) -> list[str]:
    """``tokens`` with every placeholder replaced by its formatted value.

    KeyError names a placeholder without a value (the loader rules that out for a
    validated config)."""

    def one(m: re.Match[str]) -> str:
        if m[0] == "{{":
            return "{"
        if m[0] == "}}":
            return "}"
        return format_value(values[m[1]])

    return [_TOKEN.sub(one, token) for token in tokens]
