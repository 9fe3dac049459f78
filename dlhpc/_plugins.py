"""Named plugins: built-in entry-point strings plus the installed packages' entry points.

A plugin is an object named by an entry point, ``module:attribute`` (the form of
``[project.entry-points."GROUP"]`` in a ``pyproject.toml``). dlhpc lists its own
plugins of a group as such strings in code (so a stale editable install, whose
metadata predates a new built-in, still finds them), and reads the installed
packages' entry points of the group only when asked: scanning every installed
distribution's metadata costs start-up time the ``dlhpc`` command should not pay
when the name is a built-in. Both registries (searchers in :mod:`dlhpc.config.searchers`,
scheduler backends in :mod:`dlhpc.scheduler.registry`) load through here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

__all__ = ["entry_point_names", "entry_points_by_name", "load_entry_point", "load_reference"]


def load_reference(ref: str) -> Any:
    """The object ``ref`` (``module:attribute``, the attribute possibly dotted) names.

    Import errors of the module and a missing attribute (:class:`AttributeError`)
    propagate; callers word them for their users.
    """
    module, _, attr = ref.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _grouped(group: str) -> dict[str, list[EntryPoint]]:
    from importlib.metadata import entry_points  # ~15 ms: only when a scan is due

    found: dict[str, list[EntryPoint]] = {}
    for ep in entry_points(group=group):
        found.setdefault(ep.name, []).append(ep)
    return found


def _single(group: str, name: str, found: list[EntryPoint]) -> EntryPoint:
    values = sorted({ep.value for ep in found})
    if len(values) > 1:
        raise ValueError(
            f"{group} entry point {name!r} is registered more than once ({', '.join(values)})"
        )
    return found[0]


def entry_point_names(group: str) -> tuple[str, ...]:
    """The names the installed packages register in ``group`` (scans their metadata)."""
    return tuple(sorted(_grouped(group)))


def entry_points_by_name(group: str) -> dict[str, EntryPoint]:
    """The installed packages' entry points of ``group`` by name, sorted by name
    (scans their metadata; nothing is imported).

    Raises :class:`ValueError` when several installed packages register one name
    with different values (the choice would depend on install order); the same
    value registered twice (a package on the path twice) is one entry point.
    """
    return {name: _single(group, name, eps) for name, eps in sorted(_grouped(group).items())}


def load_entry_point(group: str, name: str, builtin: str | None) -> Any:
    """Import the object ``name`` names: ``builtin`` (``module:attribute``) when given,
    else the installed entry point ``name`` of ``group``.

    Raises :class:`ValueError` when no entry point has that name, or several
    installed packages register it (the choice would depend on install order).
    Import errors of the plugin's module propagate.
    """
    if builtin is not None:
        return load_reference(builtin)
    found = _grouped(group).get(name)
    if not found:
        raise ValueError(f"no {group} entry point named {name!r}")
    return _single(group, name, found).load()
