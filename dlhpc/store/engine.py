"""Opening the SQLite database: pragmas, transactions, schema version.

Writers start every transaction with ``BEGIN IMMEDIATE`` so that two writers
serialise at the start of a transaction instead of failing half-way with
"database is locked" on the upgrade from a read lock. Readers use deferred
transactions and wait (``busy_timeout``) while a writer commits.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy import Engine, create_engine, event, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from dlhpc.errors import SchemaVersionError, StoreError
from dlhpc.store import lab_tables as _lab_tables  # noqa: F401  (registers the v6 tables)
from dlhpc.store.tables import Base, Meta

SCHEMA_VERSION = 6
BUSY_TIMEOUT_MS = 30_000


def make_engine(
    path: Path, *, writer: bool, journal_mode: str = "delete", read_only: bool = False
) -> Engine:
    """An engine for the DB at ``path``; ``writer`` selects BEGIN IMMEDIATE;
    ``read_only`` opens it with SQLite's ``mode=ro`` (a lab member's database)."""
    args: dict[str, Any] = {"timeout": BUSY_TIMEOUT_MS / 1000, "check_same_thread": False}
    if read_only:  # the URI goes to sqlite3 as it is, not through SQLAlchemy's URL parsing
        uri = f"file:{quote(str(path))}?mode=ro"
        engine = create_engine("sqlite://", creator=lambda: sqlite3.connect(uri, uri=True, **args))
    else:
        engine = create_engine(f"sqlite:///{path}", connect_args=args)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: sqlite3.Connection, _rec: Any) -> None:
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA foreign_keys=ON")
        if writer:
            cur.execute(f"PRAGMA journal_mode={'WAL' if journal_mode == 'wal' else 'DELETE'}")
            cur.execute("PRAGMA synchronous=FULL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE" if writer else "BEGIN")

    return engine


def init_schema(writer: Engine, reader: Engine) -> None:
    """Check the schema version; create the tables first on a new DB.

    An existing DB is only read here, so opening a store (``dlhpc status``)
    never waits for a reconciler's write transaction.
    """
    try:
        version = read_version(reader)
        if version is None:
            with Session(writer) as session, session.begin():
                version = _read_version(session)  # another process may have won the race
                if version is None:
                    Base.metadata.create_all(session.connection())
                    session.add(Meta(key="schema_version", value=str(SCHEMA_VERSION)))
                    return
    except SQLAlchemyError as err:
        cause = getattr(err, "orig", None) or err
        raise StoreError(f"cannot open the state database: {cause}") from err
    check_version(version)


def check_version(version: int | None) -> None:
    if version is None:
        raise StoreError("the state database has no schema version (not a dlhpc database?)")
    if version > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"the state database has schema v{version}, newer than this dlhpc (v{SCHEMA_VERSION});"
            " upgrade dlhpc"
        )
    if version < SCHEMA_VERSION:
        raise SchemaVersionError(
            f"the state database has schema v{version}, this dlhpc needs v{SCHEMA_VERSION};"
            " back it up, then run `dlhpc db migrate`"
        )


def _read_version(session: Session) -> int | None:
    has_meta = (
        session.connection()
        .exec_driver_sql("SELECT name FROM sqlite_master WHERE type='table' AND name='meta'")
        .first()
    )
    if has_meta is None:
        return None
    value = session.scalar(select(Meta.value).where(Meta.key == "schema_version"))
    return int(value) if value is not None else None


def migrate(writer: Engine) -> tuple[int, int]:
    """Apply every migration from the DB's version to SCHEMA_VERSION; returns (from, to)."""
    from dlhpc.store._migrations import MIGRATIONS

    with Session(writer) as session, session.begin():
        start = _read_version(session)
        if start is None:
            raise StoreError("the state database has no schema version (not a dlhpc database?)")
        if start > SCHEMA_VERSION:
            check_version(start)
        version = start
        while version < SCHEMA_VERSION:
            if version not in MIGRATIONS:
                raise SchemaVersionError(f"no migration from schema v{version}")
            MIGRATIONS[version](session.connection())
            version += 1
        meta = session.get(Meta, "schema_version")
        assert meta is not None  # read above
        meta.value = str(version)
    return start, version


def read_version(engine: Engine) -> int | None:
    with Session(engine) as session:
        return _read_version(session)
