"""Proposers: "what to try" for the rung searchers ``asha`` and ``hyperband``.

A rung searcher decides how long each trial trains; its proposer decides each new
trial's configuration (``searcher: {name: asha, proposer: random}``, or with settings
``proposer: {name: tpe, gamma: 0.2}``; none given: :data:`DEFAULT_PROPOSER`). A
proposer is pure and seeded:

* ``propose(index, pooled)``: the configuration of trial ``index`` (trials are
  proposed in order ``0, 1, 2, ...``), given the rung results so far, ``pooled``:
  rung length -> the results (request id -> metric) of each bracket at that length;
* ``state()`` / ``load(state, trials)``: the keys it adds to the searcher's state
  (none for ``random``), and their inverse; ``reset()``.

``tpe`` (the default, :mod:`dlhpc.search._tpe`) is a model of the rung results;
``random`` is random search's trial ``index`` (:func:`~dlhpc.search._rungs.sample_config`).
The default was chosen on the LCBench benchmark (docs/BENCHMARKS.md, "Search on LCBench").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Protocol

from dlhpc.config.schema import HParam, SearcherConfig
from dlhpc.config.searcher_rules import Report
from dlhpc.search._rungs import sample_config
from dlhpc.search._tpe import TPEProposer, check_tpe_settings

__all__ = ["DEFAULT_PROPOSER", "PROPOSERS", "Proposer", "check_proposer", "make_proposer"]

PROPOSERS = ("random", "tpe")
#: What a rung searcher's config without a proposer (``proposer: None``) gets.
DEFAULT_PROPOSER = "tpe"


class Proposer(Protocol):
    name: str

    def propose(self, index: int, pooled: Mapping[int, list[dict[int, float]]]) -> dict[str, Any]:
        """The configuration of trial ``index``."""

    def state(self) -> dict[str, Any]:
        """The keys this proposer adds to the searcher's state."""

    def load(self, state: Mapping[str, Any], trials: int) -> None:
        """Restore :meth:`state` (``trials``: how many the searcher created)."""

    def reset(self) -> None:
        """Forget every proposal."""


class RandomProposer:
    """Random search's configurations: trial ``index`` is ``random``'s trial ``index``."""

    name = "random"

    def __init__(self, space: Mapping[str, HParam], seed: int) -> None:
        self.space, self.seed = dict(space), seed

    def propose(self, index: int, pooled: Mapping[int, list[dict[int, float]]]) -> dict[str, Any]:
        return sample_config(self.space, self.seed, index)

    def state(self) -> dict[str, Any]:
        return {}

    def load(self, state: Mapping[str, Any], trials: int) -> None:
        return None

    def reset(self) -> None:
        return None


def check_proposer(config: SearcherConfig, report: Report) -> SearcherConfig:
    """``config`` with its proposer named (:data:`DEFAULT_PROPOSER` when it has none) and
    the proposer's defaults; a bad name or setting goes to ``report`` at
    ``searcher.proposer`` (or the setting's key below it)."""
    path = ("searcher", "proposer")
    if config.proposer is None:
        config = dataclasses.replace(config, proposer=DEFAULT_PROPOSER)
    if config.proposer not in PROPOSERS:
        report.add(path, f"unknown proposer {config.proposer!r} (known: {', '.join(PROPOSERS)})")
        return config
    if config.proposer == "random":
        if config.proposer_settings:
            report.add(path, "proposer 'random' has no settings")
        return config
    settings, problems = check_tpe_settings(config.proposer_settings)
    for key, message in problems:
        report.add((*path, key), message)
    return dataclasses.replace(config, proposer_settings=settings)


def make_proposer(space: Mapping[str, HParam], config: SearcherConfig) -> Proposer:
    """The proposer ``config`` names (none: :data:`DEFAULT_PROPOSER`); :class:`ValueError`
    for an unknown one or bad settings."""
    name = config.proposer or DEFAULT_PROPOSER
    if name == "random" and not config.proposer_settings:
        return RandomProposer(space, config.seed)
    if name == "tpe":
        settings, problems = check_tpe_settings(config.proposer_settings)
        if problems:
            raise ValueError("tpe proposer: " + "; ".join(f"{k}: {m}" for k, m in problems))
        return TPEProposer(space, config.seed, config.smaller_is_better, settings)
    raise ValueError(
        f"unknown proposer {config.proposer!r} or settings (known: {', '.join(PROPOSERS)})"
    )
