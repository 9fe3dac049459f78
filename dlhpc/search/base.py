"""The searcher contract: pure ask/tell objects.

A searcher decides which trials to create, how long each may train, which to
continue and which to stop. It does no I/O, reads no clock and draws all
randomness from its own seeded generator, so the same calls give the same
answers; the orchestrator (or the simulator) drives it and persists
:meth:`BaseSearcher.state_dict` after every decision.

Protocol:

* :meth:`ask` returns operations: :class:`Create` a trial (a searcher-local
  ``request_id``, its hyperparameters and the length it may train for),
  :class:`Continue` an existing trial to a longer length (promotion), or
  :class:`Stop` one (early stopping). ``ask(max_new)`` never returns more than
  ``max_new`` creations; it may return nothing while it waits for results.
* :meth:`tell` gives the searcher a trial's metric once it trained to
  ``length``; :meth:`tell_exited` says a trial will report nothing more
  (finished, failed or killed).
* :attr:`done` is true once the searcher will never ask for anything again
  and every trial it created has exited.
* ``state_dict()`` is JSON-serialisable; ``load_state_dict(state_dict())`` on a
  fresh instance built from the same config restores an identical searcher.
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
        """Next operations; at most ``max_new`` of them are :class:`Create`."""

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
