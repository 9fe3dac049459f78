"""The searcher contract: pure ask/tell objects.

A searcher decides which trials to create, how long each may train, which to
continue and which to stop. It does no I/O, reads no clock and draws all
randomness from its own seeded generator, so the same calls give the same
answers; the orchestrator (or the simulator, or a benchmark driver) drives it
and persists :meth:`BaseSearcher.state_dict` after every decision.

Protocol:

* :meth:`ask` returns operations: :class:`Create` a trial (a searcher-local
  ``request_id``, its hyperparameters and the length it may train to, its
  *grant*), :class:`Continue` a trial to a longer grant (promotion), or
  :class:`Stop` one (early stopping). ``ask(max_new)`` returns at most
  ``max_new`` operations that start work (Create and Continue: ``max_new`` is
  the number of free slots); Stop operations are not counted. It may return
  nothing while it waits for results.
* A trial trains until it reaches its grant, reporting the searcher metric at
  lengths (steps) of its choosing, then pauses: its job checkpoints and ends,
  freeing its slot. The driver calls :meth:`tell` for every new metric point
  (``length`` = the reported step, in the same unit as the grant) in increasing
  length order; a ``tell`` at ``length >= grant`` means the trial has paused
  (the searcher counts it as no longer running). A Continue for a paused trial
  resumes it from its checkpoint in a new job; a Continue for a trial still
  running raises its grant. A Stop ends the trial (a running one is asked to
  stop, then killed), as does reaching ``config.max_length``.
* :meth:`tell_exited` says a trial will report nothing more: it completed its
  final length, was stopped, failed, or was killed. It is called exactly once
  per trial, after its last ``tell``; a trial can exit without any ``tell``.
* :attr:`done` is true once the searcher will never ask for anything again
  and every trial it created has exited (a searcher must Stop the trials it
  left paused before it can be done).
* ``state_dict()`` is strict JSON (no NaN or infinite floats: the built-ins
  write them as strings); ``load_state_dict(state_dict())`` on a fresh instance
  built from the same config restores an identical searcher (the same future
  answers to the same calls); a state it cannot read (another kind, another
  config, malformed) raises :class:`ValueError`.
* Unknown request ids raise :class:`ValueError`.

One searcher is one module. Besides the ask/tell methods, a subclass owns, as
class attributes and classmethods (so config, the CLI, reports and the
simulator ask the class and never list searcher names themselves):

* :attr:`BaseSearcher.kind`: its name, in experiment files (``searcher.name``)
  and in its state; unique among the registered searchers.
* Its settings rules, applied by the experiment loader while it reads the
  ``searcher`` section (:class:`dlhpc.config.searcher_rules.SearcherRules`):
  :attr:`BaseSearcher.default_max_length`, :attr:`BaseSearcher.options`,
  :attr:`BaseSearcher.learns` and :meth:`BaseSearcher.check_settings`, which
  reports problems to the loader as ``(key path, message)`` (the loader adds the
  file and line) and returns the config with the searcher's defaults filled in.
  Whatever it accepts, the constructor must accept too.
* :meth:`BaseSearcher.expected_trials`: how many trials the search creates in
  all, without building the searcher (the CLI sizes its progress display by it).
* :meth:`BaseSearcher.rung_plan`: the lengths at which it compares trials, for
  reports (``()`` for a searcher without rungs).

Registering: built-ins are listed in :data:`dlhpc.search.plugins.BUILTIN`; a
third-party searcher is an entry point of the group ``dlhpc.searchers`` whose
name is its :attr:`~BaseSearcher.kind` (see :mod:`dlhpc.search.plugins`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from dlhpc.config.schema import HParam, SearcherConfig
from dlhpc.config.searcher_rules import Report

__all__ = ["BaseSearcher", "Continue", "Create", "Operation", "Stop"]


@dataclass(frozen=True)
class Create:
    request_id: int
    hparams: dict[str, Any]
    length: int


@dataclass(frozen=True)
class Continue:
    request_id: int
    length: int


@dataclass(frozen=True)
class Stop:
    request_id: int


Operation = Create | Continue | Stop


class BaseSearcher(ABC):
    """Base of every searcher; see the module docstring for the contract."""

    kind: ClassVar[str]
    #: ``max_length`` when the experiment gives none; None: the key is required.
    default_max_length: ClassVar[int | None] = None
    #: The optional keys it knows among ``mode``, ``min_length``, ``stop_once``,
    #: ``proposer`` and ``max_budget``.
    options: ClassVar[frozenset[str]] = frozenset()
    #: Learns from results: bounded concurrency unless ``max_concurrent_trials`` is set.
    learns: ClassVar[bool] = False

    @classmethod
    def check_settings(
        cls, config: SearcherConfig, space: Mapping[str, HParam], report: Report
    ) -> SearcherConfig:
        """``config`` with this searcher's defaults; its problems go to ``report``.

        Runs after the shared fields were checked (``report.ok(path)`` tells
        whether one was fine). The base accepts everything as it is.
        """
        return config

    @classmethod
    def expected_trials(cls, config: SearcherConfig, space: Mapping[str, HParam]) -> int:
        """Trials the search creates in all (the base: ``config.max_trials``)."""
        return config.max_trials

    @classmethod
    def rung_plan(cls, settings: Mapping[str, Any]) -> tuple[int, ...]:
        """The rung lengths of a search with the stored ``searcher`` section
        ``settings`` (a mapping, maybe from an older version); ``()`` when it has
        no rungs or the settings do not tell. The base has none."""
        return ()

    def __init__(self, space: dict[str, HParam], config: SearcherConfig) -> None:
        self.space = space
        self.config = config

    @abstractmethod
    def ask(self, max_new: int) -> list[Operation]:
        """Next operations; at most ``max_new`` of them are Create or Continue."""

    @abstractmethod
    def tell(self, request_id: int, length: int, metric: float) -> None:
        """Trial ``request_id`` reached ``length`` with searcher metric ``metric``."""

    @abstractmethod
    def tell_exited(self, request_id: int) -> None:
        """Trial ``request_id`` will report nothing more."""

    @property
    @abstractmethod
    def done(self) -> bool:
        """True when the search is over (nothing more to ask, all trials exited)."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """The state, as strict JSON data (see the module doc)."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
