"""Entry points: the plugins that installed packages register, one group at a time.

A kind of plugin (searchers, scheduler backends) keeps its built-ins in code and
asks here for the others, which packages register as entry points
(``[project.entry-points."GROUP"]`` in their ``pyproject.toml``). Reading them
scans every installed distribution's metadata, so a kind asks only for a name
that is not built-in or when it lists every name; nothing is imported until
:func:`load` is called.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

__all__ = ["installed", "load"]


def installed(group: str, kind: str, builtin: Collection[str]) -> dict[str, EntryPoint]:
    """The entry points of ``group`` by name, sorted by name (nothing is imported).

    Raises :class:`ValueError` when one takes a ``builtin`` name (a built-in
    cannot be replaced), or when several packages register one name with
    different values (the choice would depend on install order); the same value
    registered twice (a package on the path twice) is one entry point. ``kind``
    names the plugins in messages (``searcher``).
    """
    from importlib.metadata import entry_points  # imported only when a scan is due

    found: dict[str, list[EntryPoint]] = {}
    for ep in entry_points(group=group):
        if ep.name in builtin:
            raise ValueError(
                f"entry point {ep.name} = {ep.value} (group {group}) reuses the built-in "
                f"{kind} name {ep.name!r}; rename it"
            )
        found.setdefault(ep.name, []).append(ep)
    for name, eps in found.items():
        values = sorted({ep.value for ep in eps})
        if len(values) > 1:
            raise ValueError(
                f"{group} entry point {name!r} is registered more than once ({', '.join(values)})"
            )
    return {name: found[name][0] for name in sorted(found)}


def load(ep: EntryPoint, kind: str) -> Any:
    """The object ``ep`` names. Whatever importing it raises (a plugin's own failure)
    becomes a :class:`ValueError` naming the entry point."""
    try:
        return ep.load()
    except Exception as err:  # any failure of a third party's module
        raise ValueError(f"cannot load {kind} {ep.name!r} ({ep.value}): {err}") from err
