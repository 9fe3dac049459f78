"""Named plugins: built-in entry-point strings plus the installed packages' entry points.

A plugin is an object named by an entry point, ``module:attribute`` (the form of
``[project.entry-points."GROUP"]`` in a ``pyproject.toml``). dlhpc lists its own
plugins of a group as such strings in code (so a stale editable install, whose
metadata predates a new built-in, still finds them), and reads the installed
packages' entry points of the group only when asked: scanning every installed
distribution's metadata costs start-up time the ``dlhpc`` command should not pay
when the name is a built-in.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

__all__ = ["entry_point_names", "load_entry_point"]


def entry_point_names(group: str) -> tuple[str, ...]:
    """The names the installed packages register in ``group`` (scans their metadata)."""
    from importlib.metadata import entry_points  # ~15 ms: only when a scan is due

    return tuple(sorted({ep.name for ep in entry_points(group=group)}))


def load_entry_point(group: str, name: str, builtin: str | None) -> Any:
    """Import the object ``name`` names: ``builtin`` (``module:attribute``) when given,
    else the installed entry point ``name`` of ``group``.

    Raises :class:`ValueError` when no entry point has that name, or several
    installed packages register it (the choice would depend on install order).
    Import errors of the plugin's module propagate.
    """
    if builtin is not None:
        module, _, attr = builtin.partition(":")
        obj: Any = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
        return obj
    from importlib.metadata import entry_points

    found: list[EntryPoint] = [ep for ep in entry_points(group=group) if ep.name == name]
    if not found:
        raise ValueError(f"no {group} entry point named {name!r}")
    if len({ep.value for ep in found}) > 1:
        values = ", ".join(sorted({ep.value for ep in found}))
        raise ValueError(f"{group} entry point {name!r} is registered more than once ({values})")
    return found[0].load()
