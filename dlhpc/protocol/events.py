"""Event files: how a job reports to the reconciler.

Compute nodes never open the database (principle 2). A job writes only
*immutable* files, each published atomically (:mod:`dlhpc.protocol.atomic`);
the reconciler ingests each file exactly once, keyed by (attempt, file name).
An attempt folder (:func:`dlhpc.protocol.layout.attempt_dir`) holds
``<stream>-<seq:08d>.jsonl`` files; ``stream`` names one writer inside an
attempt (``worker-r0``, ``user-r0``, ...), so concurrent writers never race on
sequence numbers.

Event records (one JSON object per line, ``type`` first):

* ``{"type": "start", "time", "host", "pid", "job_id", "restart", "rank", "nodes"}``
* ``{"type": "metric", "time", "step", "metrics": {name: float}}``
* ``{"type": "metrics", "n", "step", "time_ns", "values"}``: consecutive ``metric``
  records in one line, their columns packed in binary (see
  :mod:`dlhpc.protocol.metric_lines`), as the harness writes them
  (:func:`encode_records`); the reader expands it into ``metric`` records in place
  (:func:`read_event_batches`), so ingest sees only ``metric``
* ``{"type": "exit", "time", "code", "reason", "signal", "step", "checkpoint_step"}``;
  reason is ``completed``, ``requeue`` (the script checkpointed and exited with
  :data:`REQUEUE_EXIT_CODE` to be run again), ``signal`` (it died of a signal Slurm
  sent, e.g. at preemption), ``error``, or ``setup`` (written by the job script, stream
  ``setup``, when a setup line failed before the worker started; a ``log`` record
  names the line); ``signal`` names the first signal the worker saw (``TERM``,
  ``USR2``...) or is null; optional ``preempted`` (true/false, from rank 0 after a
  ``TERM``: whether the scheduler said it was preempting the job), absent in older
  records and where it was not asked or the scheduler could not tell
* ``{"type": "checkpoint", "time", "step", "path", "size", "metric", "metric_step"}``: a
  checkpoint was published; ``metric`` is the searcher metric reported since the
  previous checkpoint (null: none was; absent in older jobs' records)
* ``{"type": "log", "time", "level", "message"}``
* ``{"type": "env", "time", "rank", "record": {...}}``: the attempt's environment as
  the job saw it (host, nodes, CPU, GPUs/driver/CUDA, allowed env vars, data
  fingerprint; see :mod:`dlhpc.repro`), from local rank 0 of each node; ingested into
  ``attempts.env_json``
* ``{"type": "gpu", "time", "host", "gpus": [...]}``: GPU samples of one node, stream
  ``gpu-n<node>`` (see :mod:`dlhpc.protocol.gpu`); ingested into ``gpu_samples``

Besides the event files, an attempt folder holds the heartbeat and progress
files, rewritten in place (see :mod:`dlhpc.protocol.layout`). Standard library only.
"""

from __future__ import annotations

import errno
import json
import os
import re
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import groupby, islice
from pathlib import Path
from typing import Any, cast

from dlhpc.protocol.atomic import atomic_write_text
from dlhpc.protocol.layout import attempts_dir
from dlhpc.protocol.metric_lines import MAX_ROWS_PER_LINE, MetricRow, encode_rows, expand
from dlhpc.protocol.record_check import check_record
from dlhpc.protocol.safe_read import EVENT_FILE_LIMIT, UnsafeFile, open_regular

__all__ = [
    "EVENT_FILE_RE",
    "REQUEUE_EXIT_CODE",
    "LINE_LIMIT",
    "EventBatch",
    "EventWriter",
    "MetricRow",
    "encode_record",
    "encode_records",
    "check_trial_folders",
    "iter_attempt_dirs",
    "iter_records",
    "event_file_names",
    "read_event_batches",
]

REQUEUE_EXIT_CODE = 75  # sysexits' EX_TEMPFAIL: "checkpointed, run me again"
# one line of an event file: a packed metrics line of MAX_ROWS_PER_LINE rows holds
# thousands of metrics well below this
LINE_LIMIT = 8 * 2**20

EVENT_FILE_RE = re.compile(r"^(?P<stream>[A-Za-z0-9_-]+)-(?P<seq>\d{8})\.jsonl$")
_STREAM_RE = re.compile(r"^[A-Za-z0-9_]+(-[A-Za-z0-9_]+)*$")
# json.dumps(r, sort_keys=True, allow_nan=True) builds this encoder on every call
_ENCODER = json.JSONEncoder(sort_keys=True, allow_nan=True)
_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")  # a \\u escape of a UTF-16 surrogate


def encode_record(record: dict[str, Any]) -> str:
    """One line of an event file: ``json.dumps(record, sort_keys=True,
    allow_nan=True)`` and a newline (the encoder is built once)."""
    return _ENCODER.encode(record) + "\n"


def encode_records(records: Iterable[dict[str, Any] | MetricRow]) -> Iterator[str]:
    """The lines of an event file for ``records``, in order: a record (a dict) is one
    line (:func:`encode_record`); each run of consecutive rows (:data:`MetricRow`) is
    one ``metrics`` line per run of the same metric names (:mod:`.metric_lines`).
    :func:`read_event_batches` gives back the same records either way."""
    # runs of one kind found by groupby and rows taken a line's worth at a time by
    # islice: C loops, not a bytecode step per row; a line is still yielded before the
    # rows after it are read, so that a caller may let go of the GIL between lines
    for kind, group in groupby(records, key=type):
        if issubclass(kind, dict):
            yield from map(encode_record, cast(Iterator[dict[str, Any]], group))
            continue
        rows = cast(Iterator[MetricRow], group)
        while chunk := list(islice(rows, MAX_ROWS_PER_LINE)):
            yield from encode_rows(chunk, encode_record)


class EventWriter:
    """Buffers event records and publishes them as immutable numbered files.

    Not thread-safe; one writer per (attempt folder, stream). ``flush`` is
    cheap when nothing is buffered. A writer resumes numbering after the
    highest existing file of its stream, so a restarted process never
    overwrites a published file.
    """

    def __init__(self, attempt_dir: Path, stream: str) -> None:
        if not _STREAM_RE.fullmatch(stream):
            raise ValueError(f"bad stream name {stream!r}")
        self.attempt_dir = attempt_dir
        self.stream = stream
        attempt_dir.mkdir(parents=True, exist_ok=True)
        existing = [
            int(m["seq"])
            for p in attempt_dir.iterdir()
            if (m := EVENT_FILE_RE.match(p.name)) and m["stream"] == stream
        ]
        self._seq = max(existing, default=-1) + 1
        self._buffer: list[dict[str, Any]] = []

    def add(self, record_type: str, **fields: Any) -> None:
        self._buffer.append({"type": record_type, "time": time.time(), **fields})

    def pending(self) -> int:
        return len(self._buffer)

    def flush(self) -> Path | None:
        """Publish buffered records as one new file; returns its path (None if empty)."""
        path = self.publish(self._buffer)
        self._buffer.clear()
        return path

    def publish(self, records: Sequence[dict[str, Any] | MetricRow]) -> Path | None:
        """Publish ``records`` (as :meth:`add` builds them, or rows: :data:`MetricRow`) as
        the stream's next file, bypassing the buffer; returns its path (None if empty)."""
        return self.publish_text("".join(encode_records(records)))

    def publish_text(self, body: str) -> Path | None:
        """Publish ``body`` (lines from :func:`encode_record`) as the stream's next
        file; returns its path (None if empty). On error nothing is published and the
        sequence number is not used up."""
        if not body:
            return None
        path = self.attempt_dir / f"{self.stream}-{self._seq:08d}.jsonl"
        atomic_write_text(path, body)
        self._seq += 1
        return path


@dataclass(frozen=True)
class EventBatch:
    """One published event file: its records, or why it is not read (``problem``:
    for good, so it is quarantined; or, when ``retry``, an I/O error a later read
    may not meet)."""

    name: str
    records: list[dict[str, Any]]
    problem: str = ""
    retry: bool = False


def check_trial_folders(trial_path: Path, *below: Path) -> None:
    """Raise :class:`OSError` (``ELOOP``) when the trial folder, its ``trials/`` folder,
    its run folder or any of ``below`` (folders under the trial's) is a symlink: a job
    replaced it, and nothing under it may be read."""
    for folder in (trial_path.parent.parent, trial_path.parent, trial_path, *below):
        if folder.is_symlink():
            raise OSError(errno.ELOOP, "a symlink where dlhpc made a folder", str(folder))


def iter_attempt_dirs(trial_path: Path) -> Iterator[Path]:
    """The attempt folders of a trial; a symlink (a job pointing elsewhere) is never one.

    Raises :class:`OSError` as :func:`check_trial_folders` does.
    """
    check_trial_folders(trial_path)
    attempts = attempts_dir(trial_path)
    if attempts.is_symlink() or not attempts.is_dir():
        return
    # names, not paths, sorted (the same order: one folder); a folder, not a link to one
    with os.scandir(attempts) as entries:
        names = sorted(e.name for e in entries if e.is_dir(follow_symlinks=False))
    yield from (attempts / name for name in names)


def event_file_names(attempt_path: Path, skip: Iterable[str] = ()) -> list[str]:
    """The names of the published event files of an attempt folder, except those in
    ``skip``, in name order (the order they were published in, per stream). Temp files
    (dot-prefixed) are never listed; nothing is opened."""
    done = set(skip)
    # names, not paths, sorted: the same order (one folder), without Path comparisons
    return [
        name
        for name in sorted(os.listdir(attempt_path))
        if name not in done and EVENT_FILE_RE.match(name)
    ]


def read_event_batches(attempt_path: Path, skip: Iterable[str] = ()) -> list[EventBatch]:
    """Every published event file of an attempt (but those in ``skip``, see
    :func:`event_file_names`) with its records in memory, each file read once
    (:func:`iter_records`, whose checks apply): for tools and tests; ingest streams
    them instead. A file that fails is a batch without records and with its
    ``problem``, never raised: one bad file stops no other. A file gone since it was
    listed is left out."""
    batches = []
    for name in event_file_names(attempt_path, skip):
        try:
            records = list(iter_records(attempt_path / name))
        except FileNotFoundError:
            continue
        except UnsafeFile as err:
            batches.append(EventBatch(name, [], err.reason, err.transient))
            continue
        batches.append(EventBatch(name, records))
    return batches


def iter_records(path: Path) -> Iterator[dict[str, Any]]:
    """The records of one event file, one line at a time, all read through the one
    descriptor opened first; raises :class:`UnsafeFile` naming the first line that
    fails, :class:`FileNotFoundError` when the file is absent. A caller that applies
    records as they come undoes them all when it raises (a job may rewrite its file
    while it is read): what a file implies is taken whole or not at all.

    The file is opened by :func:`~dlhpc.protocol.safe_read.open_regular` (no symlink,
    no FIFO, a regular file of at most :data:`EVENT_FILE_LIMIT` bytes); each line is
    read with a bound of :data:`LINE_LIMIT` bytes, decoded as strict UTF-8 and its
    record checked (:func:`~dlhpc.protocol.record_check.check_record`); a ``metrics``
    line is expanded into its ``metric`` records in place."""
    fd, size = open_regular(path)
    try:
        if size > EVENT_FILE_LIMIT:
            raise UnsafeFile(path, f"{size} bytes, over the limit of {EVENT_FILE_LIMIT}")
        with open(fd, "rb", closefd=False) as f:
            offset = 0
            for number, line in enumerate(iter(lambda: f.readline(LINE_LIMIT + 1), b""), 1):
                if len(line) > LINE_LIMIT:
                    raise UnsafeFile(path, f"line {number}: over {LINE_LIMIT} bytes")
                if offset + len(line) > EVENT_FILE_LIMIT:
                    raise UnsafeFile(path, f"grew past the limit of {EVENT_FILE_LIMIT} bytes")
                yield from _line_records(path, line, number, offset)
                offset += len(line)
    except OSError as err:
        raise UnsafeFile(path, f"read: {err.strerror}", transient=True) from None
    finally:
        os.close(fd)


def _line_records(path: Path, line: bytes, number: int, offset: int) -> list[dict[str, Any]]:
    """The records of one line (none when blank); :class:`UnsafeFile` when it fails."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UnsafeFile(path, f"not UTF-8 at byte {offset + err.start}") from None
    if not text.strip():
        return []
    try:
        record = json.loads(text)
        if "\\u" in text and _SURROGATE.search(text):
            # a lone surrogate (only an escape makes one) is no text SQLite stores
            json.dumps(record, ensure_ascii=False).encode("utf-8")
        if isinstance(record, dict) and record.get("type") == "metrics":
            return expand(record, path.name)
        check_record(record)
    except RecursionError:
        raise UnsafeFile(path, f"line {number}: JSON nested too deep") from None
    except ValueError as err:  # JSON, UnicodeEncodeError and the checks' errors
        raise UnsafeFile(path, f"line {number}: {err}") from None
    return [record]
