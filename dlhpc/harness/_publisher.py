"""Publishing a trial's event records off the training thread.

:class:`BackgroundPublisher` buffers records like
:class:`~dlhpc.protocol.EventWriter` (whose files it writes: the on-disk protocol
is the same) but hands each batch to one daemon thread, which encodes, writes,
fsyncs and renames it, so that ``ctx.report`` every step never waits for the
disk. Batches are published in the order they were handed over, one file each.
A ``metric`` record is buffered as a row (:data:`~dlhpc.protocol.events.MetricRow`,
a tuple: cheaper to build than a dict) and consecutive rows are written as one
``metrics`` line of packed columns (:mod:`dlhpc.protocol.metric_lines`), not one
JSON object per record.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from typing import Any

from dlhpc.protocol.events import EventWriter, MetricRow, encode_records

__all__ = ["BackgroundPublisher"]

_MAX_QUEUED = 8  # batches waiting for the disk; a slower disk makes submit() wait

_Record = dict[str, Any] | MetricRow


class BackgroundPublisher:
    """A buffer of event records and the thread that publishes them.

    Contracts:

    * :meth:`submit` hands the buffer to the thread and returns at once (unless
      ``_MAX_QUEUED`` batches already wait: then it waits for room);
    * :meth:`flush` returns once every record added before it is published, in
      order; a publication error is raised by the next :meth:`submit` or
      :meth:`flush` in the caller's thread, and its records (with any handed over
      after them) are kept and published again by that call's successors, in order;
    * in a forked child (e.g. a DataLoader worker) it publishes nothing: the
      parent's buffer is not the child's to publish, and the parent's thread is
      not there.
    """

    def __init__(self, writer: EventWriter) -> None:
        self.writer = writer
        self._pid = os.getpid()
        self._lock = threading.Lock()  # the buffer, the held records and the error
        # the same list for the publisher's life (submit() empties it in place): the
        # hot path appends to it directly (:attr:`rows`)
        self._buffer: list[_Record] = []
        self._held: list[_Record] = []  # a failed batch and those after it
        self._foreign: list[_Record] = []  # add_from_thread's records
        self._error: Exception | None = None
        self._queue: queue.Queue[list[_Record]] = queue.Queue(_MAX_QUEUED)
        self._thread: threading.Thread | None = None

    def add(self, record_type: str, **fields: Any) -> None:
        """Buffer one record (``type`` and ``time`` first, as EventWriter.add); from
        the thread that calls :meth:`submit`, as are :attr:`rows`' appends."""
        self._buffer.append({"type": record_type, "time": time.time(), **fields})

    def add_from_thread(self, record_type: str, **fields: Any) -> None:
        """:meth:`add` from another thread (the watchdog): handed over with the
        next batch."""
        with self._lock:
            self._foreign.append({"type": record_type, "time": time.time(), **fields})

    @property
    def rows(self) -> list[_Record]:
        """The buffer itself, the same list for the publisher's life: the hot path
        (``ctx.report``) appends :data:`MetricRow` tuples to it directly, from the
        thread that calls :meth:`submit`, saving a method call per record."""
        return self._buffer

    def pending(self) -> int:
        return len(self._buffer)

    def submit(self) -> None:
        """Hand the buffered records to the publishing thread (one file)."""
        if os.getpid() != self._pid:  # a forked child: see the class docstring
            self._buffer.clear()
            return
        error = self._error
        if error is not None:  # the thread holds what was queued after the failure
            self._queue.join()
        with self._lock:
            error, self._error = self._error, None
            batch = self._held + self._buffer + self._foreign
            self._buffer.clear()
            self._held, self._foreign = [], []
        if batch:
            if self._start():
                self._queue.put(batch)
            else:  # interpreter shutdown, no thread: publish in this thread
                self.writer.publish(batch)
        if error is not None:
            raise error

    def flush(self) -> None:
        """Publish everything added so far, in order, before returning."""
        self.submit()
        if os.getpid() == self._pid and self._thread is not None:
            self._queue.join()
            with self._lock:
                error, self._error = self._error, None
            if error is not None:
                raise error

    def start(self) -> None:
        """Start the publishing thread now rather than at the first hand-over: a
        thread start waits for the OS to schedule the new thread (milliseconds on a
        loaded node), which the training thread should pay at ``init``, not in a
        ``report`` call."""
        self._start()

    def _start(self) -> bool:
        """Start the thread if needed; False if it cannot run (interpreter shutdown)."""
        if self._thread is not None and self._thread.is_alive():
            return True
        thread = threading.Thread(target=self._run, name="dlhpc-events", daemon=True)
        try:
            thread.start()
        except RuntimeError:  # "can't create new thread at interpreter shutdown"
            return False
        self._thread = thread
        return True

    def _run(self) -> None:
        while True:
            batch = self._queue.get()
            try:
                with self._lock:
                    failed = self._error is not None
                    if failed:  # keep the order: nothing after a failed batch goes first
                        self._held.extend(batch)
                if not failed:
                    try:
                        self.writer.publish_text(_encode(batch))
                    except Exception as err:  # raised in the caller, as before
                        with self._lock:
                            self._error = err
                            self._held = batch + self._held
            finally:
                self._queue.task_done()

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the queued batches to be published (a
        last-resort flush from another thread); True if they were."""
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)
        return not self._queue.unfinished_tasks


def _encode(batch: list[_Record]) -> str:
    """The file body for ``batch``, a line at a time with the GIL let go after each
    (``time.sleep(0)``): the training thread, when it comes back from a torch call,
    waits for one line (a record, or up to ``MAX_ROWS_PER_LINE`` rows), not for a
    switch interval (5 ms)."""
    parts: list[str] = []
    for line in encode_records(batch):
        parts.append(line)
        time.sleep(0)
    return "".join(parts)
