"""The one exception root of dlhpc.

Every error dlhpc raises on purpose derives from :class:`DlhpcError` and carries
the process exit code the CLI uses for it (as click's exceptions do): ``2`` for
bad input, ``1`` for a runtime failure. The CLI prints ``str(err)`` as one line
(a :class:`ConfigError` prints one line per problem) and no traceback unless
``--debug`` is given.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ConfigError",
    "ConfigIssue",
    "DlhpcError",
    "LeaseHeldError",
    "NotFoundError",
    "NotPermittedError",
    "UsageError",
    "SchedulerError",
    "SchemaVersionError",
    "StoreError",
    "UnsafePathError",
]


class DlhpcError(Exception):
    """Root of all dlhpc errors. ``exit_code`` is what the CLI exits with."""

    exit_code: int = 1


@dataclass(frozen=True)
class ConfigIssue:
    """One problem in a config file: where it is and what is wrong."""

    file: str
    line: int | None
    field: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        return (
            f"{where}: {self.field}: {self.message}" if self.field else f"{where}: {self.message}"
        )


class ConfigError(DlhpcError):
    """Bad experiment or site file. Holds *all* issues found, not just the first."""

    exit_code = 2

    def __init__(self, issues: list[ConfigIssue]) -> None:
        if not issues:
            raise ValueError("ConfigError needs at least one issue")
        self.issues = list(issues)
        super().__init__("\n".join(str(i) for i in self.issues))


class UsageError(DlhpcError):
    """Bad command-line input that is not a config file (unknown id, bad flag value)."""

    exit_code = 2


class NotFoundError(UsageError):
    """An experiment, trial or attempt id that does not exist."""


class NotPermittedError(UsageError):
    """The site's permission policy forbids this (e.g. changing another user's experiment)."""


class UnsafePathError(DlhpcError):
    """A path that should stay under a root escapes it (``..``, a symlink, an absolute path)."""


class StoreError(DlhpcError):
    """The state database failed; wraps SQLAlchemy/SQLite errors in dlhpc's words."""


class SchemaVersionError(StoreError):
    """The state database was written by a different schema version."""


class LeaseHeldError(DlhpcError):
    """Another reconciler holds the lease; the caller should exit quietly."""


class SchedulerError(DlhpcError):
    """Slurm (or the local backend) refused or failed a request.

    ``submitted`` holds whatever was submitted before the failure (earlier
    chunks of a split array), so the caller can still record those jobs.
    """

    def __init__(self, message: str, submitted: Sequence[Any] = ()) -> None:
        super().__init__(message)
        self.submitted = list(submitted)
