"""The experiments' event log: one ``events`` row per thing that happened.

:func:`log_event` is its one writer for the orchestrator: a row in the caller's
write transaction, so an event commits with the change it tells of (or not at all).
"""

from __future__ import annotations

from sqlalchemy import insert
from sqlalchemy.orm import Session

from dlhpc.store import Event, utcnow

__all__ = ["log_event"]


def log_event(
    session: Session, kind: str, message: str, exp_id: int | None, trial_id: int | None = None
) -> None:
    """Append an event row in ``session``'s transaction, at once and as a plain INSERT
    (no ORM object: a pass of a long search logs thousands, and nothing reads them
    back as objects; the rows' order is the calls' order). It does not flush the
    session: ``exp_id`` and ``trial_id`` name rows already written."""
    session.connection().execute(
        insert(Event),
        {
            "experiment_id": exp_id,
            "trial_id": trial_id,
            "time": utcnow(),
            "kind": kind,
            "message": message,
        },
    )
