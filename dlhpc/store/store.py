"""The :class:`Store`: the state folder, its database, and write discipline."""

from __future__ import annotations

import copy
import errno
import os
import sqlite3
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import create_engine, func, select
from sqlalchemy.exc import OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session
from sqlalchemy.pool import StaticPool

from dlhpc import _perms
from dlhpc._fileclock import file_time
from dlhpc._perms import MEMBERS_DIR, make_member_home
from dlhpc.errors import DlhpcError, StoreError
from dlhpc.store import lease as _lease
from dlhpc.store.engine import (
    BUSY_TIMEOUT_MS,
    check_version,
    init_schema,
    make_engine,
    read_version,
)
from dlhpc.store.tables import Experiment

if TYPE_CHECKING:
    from dlhpc.config._permissions import Permissions

__all__ = ["Store", "default_home", "is_disk_full", "lab_databases", "utcnow"]

DB_NAME = "dlhpc.db"


def utcnow() -> datetime:
    """Naive UTC now (SQLite stores naive datetimes)."""
    return datetime.now(timezone.utc).replace(tzinfo=None)


def is_disk_full(err: BaseException) -> bool:
    """True when ``err`` (or an error it was raised from) says the filesystem is full:
    SQLite's SQLITE_FULL, or ENOSPC / EDQUOT (a quota)."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, sqlite3.Error) and _sqlite_full(seen):
            return True
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        orig = getattr(seen, "orig", None)  # SQLAlchemy's wrapper of the driver's error
        seen = orig if isinstance(orig, BaseException) else seen.__cause__ or seen.__context__
    return False


_SQLITE_FULL = 13  # sqlite3.SQLITE_FULL; the module names its codes from Python 3.11


def _sqlite_full(err: sqlite3.Error) -> bool:
    """SQLite's result code SQLITE_FULL; Python 3.10 gives only its message (SQLite's
    fixed text for that code)."""
    code = getattr(err, "sqlite_errorcode", None)
    return code == _SQLITE_FULL if code is not None else str(err) == "database or disk is full"


def default_home(site_state_dir: Path | None = None) -> Path:
    """``$DLHPC_HOME``, else the site's ``state_dir``, else ``~/.dlhpc``: the state
    folder, or in group mode the lab folder that holds each member's."""
    env = os.environ.get("DLHPC_HOME")
    if env:
        return Path(env).expanduser().resolve()
    return (site_state_dir or Path("~/.dlhpc")).expanduser().resolve()


def lab_databases(lab: Path) -> list[tuple[str, Path]]:
    """Group mode: ``(member, database)`` of every member's state folder under the lab
    folder ``lab`` that holds a database, by member name."""
    members = lab / MEMBERS_DIR
    if not members.is_dir():
        return []
    found = []
    for folder in members.iterdir():
        st = folder.lstat()
        # a folder is a member's only if that member made it (a squatter's is not)
        if stat.S_ISDIR(st.st_mode) and _perms.user_name(st.st_uid) == folder.name:
            found.append((folder.name, folder / DB_NAME))
    return sorted((name, db) for name, db in found if db.is_file())


class Store:
    """The state folder (DB + run folders) and its single-writer rules.

    ``home`` is the state folder, or in group mode (``permissions``) the lab folder:
    the store is then the current user's ``home/users/<user>`` (:attr:`home`; the
    lab folder is :attr:`lab`). ``read_only``: open an existing database that may be
    someone else's (a lab member's) with SQLite's ``mode=ro``, create nothing, and
    refuse :meth:`write`; ``home`` is then the state folder itself.

    * :meth:`read` opens a read session; readers never block the writer for long
      and wait while it commits.
    * :meth:`write` opens a write transaction. A process that holds the
      reconciler lease has it checked and renewed in every write transaction.
    * :meth:`hold_lease` takes the reconciler lease for a block; a second
      reconciler gets :class:`~dlhpc.errors.LeaseHeldError`. The lease's times are
      on the state folder's filesystem clock (:mod:`dlhpc._fileclock`), which every
      login node sharing the database reads alike, whatever its own clock says.
    SQLAlchemy errors leave this class as :class:`~dlhpc.errors.StoreError`.
    """

    def __init__(
        self,
        home: Path,
        journal_mode: str = "delete",
        lease_ttl_s: float = 300.0,
        permissions: Permissions | None = None,
        read_only: bool = False,
    ) -> None:
        self.lab = home
        self.lease_ttl_s = lease_ttl_s
        # the site's policy: folders made at the top of a tree (reports, exports) use it
        self.permissions = permissions
        self.read_only = read_only
        self._owner: str | None = None
        self._lease_offset = timedelta(0)  # of the state folder's clock (hold_lease)
        if read_only:
            self._open_read_only(home)
            return
        try:
            home = make_member_home(home, permissions)
        except OSError as err:
            raise StoreError(f"cannot create the state folder {home}: {err.strerror}") from err
        self._set_home(home)
        _perms.warn(_perms.check_db_files(self.db_path))  # before anything writes to it
        new = not self.db_path.exists()
        self._writer = make_engine(self.db_path, writer=True, journal_mode=journal_mode)
        self._reader = make_engine(self.db_path, writer=False)
        init_schema(self._writer, self._reader)
        if new:  # SQLite made them 0644 & ~umask (journals copy the DB's mode at creation)
            for suffix in _perms.DB_SIDE_FILES:
                if Path(f"{self.db_path}{suffix}").exists():
                    _perms.umask_mode(Path(f"{self.db_path}{suffix}"))

    def _set_home(self, home: Path) -> None:
        self.home = home
        self.db_path = home / DB_NAME
        self.runs_root = home / "runs"

    def _open_read_only(self, home: Path) -> None:
        self._set_home(home)
        if not self.db_path.is_file():
            raise StoreError(f"no state database at {self.db_path}")
        self._reader = make_engine(self.db_path, writer=False, read_only=True)
        self._writer = self._reader
        with self._wrap_errors():
            check_version(read_version(self._reader))

    def close(self) -> None:
        self._writer.dispose()
        self._reader.dispose()

    @contextmanager
    def read(self) -> Iterator[Session]:
        with self._wrap_errors(), Session(self._reader, expire_on_commit=False) as session:
            yield session

    @contextmanager
    def write(self) -> Iterator[Session]:
        """One write transaction; commits on success, rolls back on any exception."""
        if self.read_only:
            raise StoreError(f"state database {self.db_path}: opened read-only")
        with (
            self._wrap_errors(),
            Session(self._writer, expire_on_commit=False) as session,
            session.begin(),
        ):
            if self._owner is not None:
                _lease.verify_and_renew(
                    session,
                    _lease.RECONCILER,
                    self._owner,
                    self.lease_ttl_s,
                    utcnow() + self._lease_offset,
                )
            yield session

    @property
    def holds_lease(self) -> bool:
        return self._owner is not None

    @contextmanager
    def hold_lease(self) -> Iterator[None]:
        """Hold the reconciler lease for the block (re-entrant)."""
        if self._owner is not None:
            yield
            return
        owner = _lease.make_owner_token()
        self._lease_offset = self._clock_offset()
        with self.write() as session:
            now = utcnow() + self._lease_offset
            _lease.take(session, _lease.RECONCILER, owner, self.lease_ttl_s, now)
        self._owner = owner
        try:
            yield
        finally:
            self._owner = None
            try:
                with self.write() as session:
                    _lease.give_back(session, _lease.RECONCILER, owner)
            except StoreError:
                pass  # it expires on its own; nothing is lost

    def _clock_offset(self) -> timedelta:
        """How far the state folder's filesystem clock is ahead of this machine's."""
        try:
            stamp = file_time(self.home)
        except OSError as err:
            raise StoreError(f"state folder {self.home}: its clock not read: {err}") from err
        return timedelta(seconds=stamp - utcnow().replace(tzinfo=timezone.utc).timestamp())

    def memory_copy(self) -> Store:
        """This store with its database copied into memory (SQLite's backup): its folders
        are this store's, what is written through it stays in that copy and goes when the
        copy is closed. The lease it holds is this store's (the copy's rows name it).
        What a pass would do is decided through it while this database cannot commit."""
        mem = sqlite3.connect(":memory:", check_same_thread=False)
        try:
            src = sqlite3.connect(self.db_path, timeout=BUSY_TIMEOUT_MS / 1000)
            try:
                src.backup(mem)
            finally:
                src.close()
        except sqlite3.Error as err:
            raise StoreError(f"state database {self.db_path}: {err}") from err
        engine = create_engine("sqlite://", creator=lambda: mem, poolclass=StaticPool)
        shadow = copy.copy(self)
        shadow._writer = shadow._reader = engine
        return shadow

    def next_experiment_id(self) -> int:
        """The id the next experiment will most likely get (for --dry-run paths)."""
        with self.read() as session:
            return int(session.scalar(select(func.max(Experiment.id))) or 0) + 1

    @contextmanager
    def _wrap_errors(self) -> Iterator[None]:
        try:
            yield
        except DlhpcError:
            raise
        except OperationalError as err:
            raise StoreError(f"state database {self.db_path}: {err.orig}") from err
        except SQLAlchemyError as err:
            raise StoreError(f"state database {self.db_path}: {err}") from err
