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
* ``state_dict()`` is JSON-serialisable; ``load_state_dict(state_dict())`` on a
  fresh instance built from the same config restores an identical searcher
  (the same future answers to the same calls).
* Unknown request ids raise :class:`ValueError`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from dlhpc.config.model import HParam, SearcherConfig

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
        """JSON-serialisable state."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
