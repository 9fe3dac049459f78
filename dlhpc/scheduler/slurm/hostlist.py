"""Slurm's compact notations: host lists (``node[01-03,7]``) and task counts (``2(x3),1``).

Standard library only: read inside jobs by :mod:`dlhpc.scheduler.slurm.environment`.
"""

from __future__ import annotations

import re

__all__ = ["expand_hostlist", "first_host", "local_world_size"]

_RANGE_RE = re.compile(r"^(\d+)(?:-(\d+))?$")
_TASKS_RE = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def _split_top(text: str) -> list[str]:
    """Split ``text`` at commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in host list {text!r}")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise ValueError(f"unbalanced '[' in host list {text!r}")
    parts.append(text[start:])
    return [p for p in parts if p]


def _expand_ranges(body: str, text: str) -> list[str]:
    """``01-03,7`` -> ``["01", "02", "03", "7"]`` (zero padding kept)."""
    out: list[str] = []
    for item in body.split(","):
        m = _RANGE_RE.match(item.strip())
        if m is None:
            raise ValueError(f"bad range {item!r} in host list {text!r}")
        lo, hi = m[1], m[2] if m[2] is not None else m[1]
        if int(hi) < int(lo):
            raise ValueError(f"descending range {item!r} in host list {text!r}")
        width = len(lo) if lo.startswith("0") else 0
        out.extend(str(n).zfill(width) for n in range(int(lo), int(hi) + 1))
    return out


def expand_hostlist(text: str) -> list[str]:
    """Expand a Slurm host list (``node[01-03,7],gpu[1-2]-ib``) into host names, in order.

    Like ``scontrol show hostnames``: comma-separated entries, each with any
    number of bracketed range groups (a cartesian product, leftmost varying
    slowest). Raises ValueError on a malformed list.
    """
    hosts: list[str] = []
    for entry in _split_top(text.strip()):
        names = [""]
        rest = entry
        while rest:
            open_at = rest.find("[")
            if open_at < 0:
                names = [n + rest for n in names]
                break
            close_at = rest.find("]", open_at)
            prefix, body, rest = rest[:open_at], rest[open_at + 1 : close_at], rest[close_at + 1 :]
            names = [n + prefix + r for n in names for r in _expand_ranges(body, text)]
        hosts.extend(names)
    return hosts


def first_host(text: str) -> str:
    """The first host of a Slurm host list."""
    hosts = expand_hostlist(text)
    if not hosts:
        raise ValueError(f"empty host list {text!r}")
    return hosts[0]


def local_world_size(tasks_per_node: str, node_id: int) -> int:
    """Tasks on node ``node_id`` from ``SLURM_TASKS_PER_NODE`` (``2(x3),1``)."""
    counts: list[int] = []
    for item in tasks_per_node.split(","):
        m = _TASKS_RE.match(item.strip())
        if m is None:
            raise ValueError(f"bad SLURM_TASKS_PER_NODE {tasks_per_node!r}")
        counts.extend([int(m[1])] * int(m[2] or 1))
    if not 0 <= node_id < len(counts):
        raise ValueError(f"node id {node_id} outside SLURM_TASKS_PER_NODE {tasks_per_node!r}")
    return counts[node_id]
