"""Plain scripts: the entrypoint template and the ``script:`` section.

An entrypoint with ``{name}`` placeholders is a template (:mod:`dlhpc._argv_template`):
every placeholder must name a hyperparameter or a name dlhpc fills
(:data:`~dlhpc._argv_template.DLHPC_NAMES`), it must split (balanced quotes) and hold
no shell syntax, and ``{checkpoint}`` needs ``{checkpoint_dir}``. ``script:`` holds
``metrics: {pattern: REGEX}``: a regex that compiles, with named groups ``step`` and
the searcher's metric. Every problem is reported at its key's line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from dlhpc._argv_template import DLHPC_NAMES, placeholders, shell_syntax, split_template
from dlhpc.config._validate import Field, Issues, did_you_mean, read_section, string
from dlhpc.config.schema import HParam, ScriptConfig

__all__ = ["read_script"]

_SCRIPT = {"metrics": Field(lambda v: v)}
_METRICS = {"pattern": Field(string(nonempty=True, single_line=True), nullable=True)}


def read_script(
    issues: Issues,
    entrypoint: str | None,
    section: Any,
    given: bool,
    space: Mapping[str, HParam],
    metric: str,
) -> ScriptConfig:
    """Validate the entrypoint as a template (when it is one) and ``script:``.

    ``given``: the file has a ``script:`` key; ``metric``: the searcher's metric."""
    names = placeholders(entrypoint) if isinstance(entrypoint, str) else []
    if names and isinstance(entrypoint, str):
        _check_template(issues, entrypoint, names, space)
    s = read_section(issues, section, ("script",), _SCRIPT)
    m = read_section(issues, s["metrics"], ("script", "metrics"), _METRICS)
    pattern = m["pattern"]
    if pattern is not None:
        _check_pattern(issues, pattern, metric)
    return ScriptConfig(enabled=bool(names) or given, metrics_pattern=pattern)


def _check_template(
    issues: Issues, entrypoint: str, names: list[str], space: Mapping[str, HParam]
) -> None:
    where = ("entrypoint",)
    valid = sorted(space)
    ours = sorted(DLHPC_NAMES)
    listing = (
        f"(hyperparameters: {', '.join(valid) or 'none'}; dlhpc: {', '.join(ours)};"
        " write {{ and }} for literal braces)"
    )
    for name in dict.fromkeys(names):
        if name not in space and name not in DLHPC_NAMES:
            hint = did_you_mean(name, [*valid, *ours])
            issues.add(where, f"placeholder {{{name}}} names no hyperparameter; {hint}{listing}")
    for name in valid:
        if name in DLHPC_NAMES and name in names:
            issues.add(
                ("hyperparameters", name),
                f"{{{name}}} is a name dlhpc fills in an entrypoint template"
                f" ({DLHPC_NAMES[name]}); rename the hyperparameter",
            )
    if "checkpoint" in names and "checkpoint_dir" not in names:
        issues.add(
            where,
            "{checkpoint} (the checkpoint to resume from) needs {checkpoint_dir} too: the"
            " folder the script writes its checkpoints into, e.g. --ckpt-dir {checkpoint_dir}",
        )
    try:
        tokens = split_template(entrypoint)
    except ValueError as exc:
        issues.add(where, f"a template entrypoint must split into words: {exc}")
        return
    problem = shell_syntax(tokens)
    if problem is not None:
        issues.add(
            where,
            f"a template entrypoint runs without a shell and {problem}; put shell steps in"
            " environment.setup and variables in environment.vars",
        )


def _check_pattern(issues: Issues, pattern: str, metric: str) -> None:
    where = ("script", "metrics", "pattern")
    try:
        compiled = re.compile(pattern)
    except (re.error, OverflowError, RecursionError) as exc:  # the last two: a huge pattern
        issues.add(where, f"is not a valid regular expression: {exc}")
        return
    groups = set(compiled.groupindex)
    missing = [g for g in ("step", metric) if g not in groups]
    if missing:
        named = ", ".join(sorted(groups)) or "none"
        issues.add(
            where,
            f"needs named groups {', '.join(f'(?P<{g}>...)' for g in missing)} (the step and the"
            f" searcher's metric {metric!r}); it has: {named}",
        )
