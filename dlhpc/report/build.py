"""Write reports: one experiment's page, or every page plus an index.

Each file is published with :func:`dlhpc.protocol.atomic_write_bytes` (temp
name in the same folder, fsync, rename), so a reader (a browser, a web server
over the folder, a cron-driven rebuild) sees the old page or the new one, never
half of one. With ``--all`` the pages are written before the index, so the
index never links to a page that is not there yet; the page of an experiment
that had already ended when its page was written is kept as it is (nothing can
change it any more but its tags, notes and model versions, whose digest the page
carries: a page whose digest is not the DB's is written again) unless ``force``, so
a cron rebuild costs the live ones only.

The index lists every experiment in the state folder, with who launched it and its
tags. In a lab's shared folder (group mode) each member has a database of their own:
``--all`` reads every member's (the others' read-only, SQLite ``mode=ro``), writes each
member's pages into a folder named after them, and one index of everyone's.
``publish`` makes the folder and pages readable by others (:mod:`dlhpc.report.publish`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import quote

from sqlalchemy import func, select

from dlhpc.report._files import INDEX_FILE, MODELS_FILE, ensure_folder, page_file, publish_file
from dlhpc.report._html import IndexEntry, render_index, render_page
from dlhpc.report._load import load_page
from dlhpc.report._page import LAB_META
from dlhpc.report._status_lab import lab_stamps
from dlhpc.report.models_index import write_models_index
from dlhpc.report.publish import check_publishable, make_public, publishing
from dlhpc.store import Experiment, Store, Tag, Trial, lab_databases

__all__ = ["INDEX_FILE", "MODELS_FILE", "AllResult", "page_file", "write_all", "write_report"]


def _utc(now: datetime | None) -> datetime:
    return now or datetime.now(timezone.utc).replace(tzinfo=None)


def write_report(store: Store, experiment_id: int, out: Path, now: datetime | None = None) -> int:
    """Write one experiment's page at ``out`` atomically; returns its size in bytes.
    Raises :class:`~dlhpc.errors.NotFoundError` for an unknown id."""
    data = render_page(load_page(store, experiment_id, _utc(now))).encode("utf-8")
    ensure_folder(out.parent, store)
    publish_file(out, data)
    return len(data)


@dataclass
class AllResult:
    # (path, bytes): the experiments' pages, then models.html, then the index
    written: list[tuple[Path, int]] = field(default_factory=list)
    kept: list[Path] = field(default_factory=list)  # pages of ended experiments left as they are


_Entry = tuple[IndexEntry, datetime | None, str]  # the entry, its end, its lab digest


def _entries(store: Store, now: datetime) -> list[_Entry]:
    """Index entries of every experiment (one query for the trial counts and bests),
    each with its end and the digest of its tags, notes and model versions."""
    with store.read() as s:
        exps = s.scalars(select(Experiment).order_by(Experiment.id)).all()
        agg = {
            eid: (n, lo, hi)
            for eid, n, lo, hi in s.execute(
                select(
                    Trial.experiment_id,
                    func.count(),
                    func.min(Trial.best_metric),
                    func.max(Trial.best_metric),
                ).group_by(Trial.experiment_id)
            )
        }
        tags: dict[int, list[str]] = {}
        for eid, name in s.execute(
            select(Tag.target_id, Tag.name).where(Tag.kind == "experiment").order_by(Tag.name)
        ):
            tags.setdefault(eid, []).append(name)
        stamps = lab_stamps(s.connection())
    out = []
    for e in exps:
        n, lo, hi = agg.get(e.id, (0, None, None))
        end = e.ended_at or now
        created = e.created_at.replace(tzinfo=timezone.utc).timestamp()
        entry = IndexEntry(
            e.id,
            e.name,
            e.state,
            e.searcher,
            e.metric,
            lo if e.smaller_is_better else hi,
            n,
            created,
            max(0.0, (end - e.created_at).total_seconds()),
            page_file(e.id),
            e.user,
            tuple(tags.get(e.id, ())),
        )
        out.append((entry, e.ended_at, stamps.get(e.id, "")))
    return out


def _shared(store: Store) -> str:
    """What the index says about whose experiments it lists."""
    policy = store.permissions
    if _group_mode(store) and policy is not None:
        return (
            f"A lab's shared state folder (group {policy.group}): every member's experiments,"
            " with who launched each."
        )
    return "Every experiment of this state folder, with who launched each."


def _group_mode(store: Store) -> bool:
    return store.permissions is not None and store.permissions.mode == "group"


def write_all(
    store: Store,
    out_dir: Path,
    now: datetime | None = None,
    progress: Callable[[int, int], None] | None = None,
    force: bool = False,
    publish: bool = False,
) -> AllResult:
    """Write the pages that may have changed and ``index.html`` into ``out_dir``.
    ``progress(done, total)`` is called after each experiment. ``publish``: checked
    first (:func:`~dlhpc.report.publish.check_publishable`), then the folder and every
    page are made readable by others."""
    if publish:
        check_publishable(out_dir, store.home)
    out = out_dir.absolute()
    created = [d for d in (out, *out.parents) if publish and not d.exists()]  # o+rx too
    with publishing() if publish else nullcontext():
        if _group_mode(store):
            result = _write_lab(store, out_dir, _utc(now), progress, force)
        else:
            result, entries = _write_all(store, out_dir, _utc(now), progress, force)
            _write_index(out_dir, entries, _utc(now), _shared(store), MODELS_FILE, result)
    if publish:
        pages = [p for p, _ in result.written] + result.kept
        make_public([*created, out, *sorted({p.parent for p in pages})], pages)  # + members'

    return result


def _write_lab(
    store: Store,
    out_dir: Path,
    now: datetime,
    progress: Callable[[int, int], None] | None,
    force: bool,
) -> AllResult:
    """Group mode: each member's pages, models.html and index in ``out_dir/<member>/``
    (read from the member's own database, read-only unless it is ``store``'s), then
    ``out_dir/index.html`` of every member's experiments."""
    ensure_folder(out_dir, store)
    result, everyone = AllResult(), []
    for member, db in lab_databases(store.lab):
        mine = db == store.db_path
        member_store = (
            store if mine else Store(db.parent, permissions=store.permissions, read_only=True)
        )
        try:
            part, entries = _write_all(member_store, out_dir / member, now, progress, force)
            shared = f"{member}'s experiments, in the lab's shared state folder."
            _write_index(out_dir / member, entries, now, shared, MODELS_FILE, part)
        finally:
            if not mine:
                member_store.close()
        result.written += part.written
        result.kept += part.kept
        everyone += [replace(e, href=f"{quote(member)}/{e.href}") for e in entries]
    _write_index(out_dir, everyone, now, _shared(store), "", result)
    return result


def _write_index(
    out_dir: Path,
    entries: list[IndexEntry],
    now: datetime,
    shared: str,
    models: str,
    result: AllResult,
) -> None:
    """Publish ``out_dir/index.html`` of ``entries``, saying ``shared`` about whose they
    are, linking ``models`` if given; recorded in ``result``."""
    stamp = now.replace(tzinfo=timezone.utc).timestamp()
    index = render_index(entries, stamp, shared, models).encode("utf-8")
    publish_file(out_dir / INDEX_FILE, index)
    result.written.append((out_dir / INDEX_FILE, len(index)))


def _write_all(
    store: Store,
    out_dir: Path,
    now: datetime,
    progress: Callable[[int, int], None] | None,
    force: bool,
) -> tuple[AllResult, list[IndexEntry]]:
    """The pages that may have changed and models.html; returns them and the index's
    entries."""
    ensure_folder(out_dir, store)
    entries = _entries(store, now)
    result = AllResult()
    for i, (entry, ended, lab) in enumerate(entries):
        path = out_dir / entry.href
        if not force and ended is not None and _written_after(path, ended, lab):
            result.kept.append(path)
        else:
            data = render_page(load_page(store, entry.id, now)).encode("utf-8")
            publish_file(path, data)
            result.written.append((path, len(data)))
        if progress is not None:
            progress(i + 1, len(entries))
    models = write_models_index(store, out_dir, now)  # small: rewritten on every run
    result.written.append((models, models.stat().st_size))
    return result, [e for e, _, _ in entries]


_STAMP = re.compile(rb'<meta name="' + LAB_META.encode() + rb'" content="([0-9a-f]*)">')


def _written_after(path: Path, ended: datetime, lab_stamp: str) -> bool:
    """Whether the page at ``path`` was written after its experiment ended and holds
    the lab digest ``lab_stamp`` (read from its first kilobyte)."""
    try:
        mtime = path.stat().st_mtime
        with open(path, "rb") as f:
            head = f.read(1024)
    except OSError:
        return False
    found = _STAMP.search(head)
    if found is None or found.group(1).decode() != lab_stamp:
        return False
    return mtime > ended.replace(tzinfo=timezone.utc).timestamp() + 1.0
