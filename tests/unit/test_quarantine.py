"""One bad job-written file stops nothing: the real tick on a real store quarantines it.

Two experiments launched by the real ``launch`` onto the stress backend (every job
RUNNING): trials A and B of the first, C of the second. Each case puts one malformed
or hostile file into A's attempt folder beside a good event file, and good files into
B's and C's. The tick must end normally, ingest every good file, mark the bad one
ingested with no records exactly once (a second tick does not warn again), name it in
a warning, and ``status`` must show A's problem. Heartbeats (rewritten in place, read
every tick) count as absent with a warning; progress files and checkpoint manifests
are read the same bounded way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select

import dlhpc.protocol.events as events_module
from dlhpc.config import load_experiment
from dlhpc.orchestrator.launch import launch
from dlhpc.orchestrator.tick import TickReport, tick
from dlhpc.protocol import HEARTBEAT_FILE, PROGRESS_FILE, EventWriter, read_small_json
from dlhpc.protocol.checkpoint import MANIFEST_NAME, latest_verified, publish_checkpoint
from dlhpc.protocol.safe_read import UnsafeFile, read_state_file
from dlhpc.report.status import status_data
from dlhpc.search import SearcherTable
from dlhpc.store import Event, IngestedFile, Metric, Store, Trial
from tests._alarm import time_bound
from tests.stress._backend import launch_stress, stress_pool, write_experiment
from tests.unit._cli import run

BAD = "user-r0-00000001.jsonl"
DEEP = 200_000


def _line(record: dict[str, object]) -> bytes:
    return json.dumps(record).encode() + b"\n"


def _metric(**fields: object) -> bytes:
    return _line({"type": "metric", "time": 1.0, "step": 1, "metrics": {"loss": 1.0}, **fields})


def _metrics_line_count_mismatch() -> bytes:
    one = "AQAAAAAAAAA="  # one int64 (1)
    record = {"type": "metrics", "n": 2, "step": one, "time_ns": one, "values": {"loss": one}}
    return _line(record)


# name -> bytes of the bad event file (a callable: a link or FIFO made in the folder)
CONTENT: dict[str, bytes] = {
    "malformed JSON": b'{"type": "metric", "step": 1,\n',
    "invalid UTF-8": b'{"type": "log", "time": 1.0, "message": "\xff\xfe"}\n',
    "list for object": b"[1, 2, 3]\n",
    "deep nesting": b"[" * DEEP + b"]" * DEEP + b"\n",
    "deep nesting in a record": b'{"type": "log", "message": ' + b"[" * 100 + b"]" * 100 + b"}\n",
    "step abc": _metric(step="abc"),
    "step 1e400": _metric().replace(b'"step": 1', b'"step": 1e400'),
    "step 10**23": _metric(step=10**23),
    "metric x": _metric(metrics={"loss": "x"}),
    "exit time 1e18": _line({"type": "exit", "time": 1e18, "code": 0, "reason": "completed"}),
    "checkpoint size 1e400": _line(
        {"type": "checkpoint", "time": 1.0, "step": 1, "path": "p", "size": 0}
    ).replace(b'"size": 0', b'"size": 1e400'),
    "packed count mismatch": _metrics_line_count_mismatch(),
    "lone surrogate": b'{"type": "log", "time": 1.0, "message": "\\ud800"}\n',
    "oversize": _metric() * 100,  # over the limit the test sets (see below)
}
LINKS: dict[str, Callable[[Path, Path], None]] = {
    "symlink to /dev/zero": lambda bad, _out: bad.symlink_to("/dev/zero"),
    "FIFO": lambda bad, _out: os.mkfifo(bad),
    "symlink to a file outside": lambda bad, out: bad.symlink_to(out),
}


@dataclasses.dataclass(frozen=True)
class World:
    store: Store
    home: Path
    attempts: dict[str, Path]  # A, B (experiment 1), C (experiment 2)
    trial_ids: dict[str, int]
    outside: Path  # a well-formed event file outside every run folder


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    home, runs = launch_stress(tmp_path / "one", 2)
    cfg = load_experiment(
        write_experiment(tmp_path / "two", 1), site="local", searchers=SearcherTable()
    )
    cfg = dataclasses.replace(cfg, backend="stress")
    store = Store(home)
    launch(cfg, store, stress_pool(home), record={})
    with store.read() as s:
        third = s.scalars(select(Trial).where(Trial.id.not_in([r.trial_id for r in runs]))).one()
        (key,) = [a.attempt_key for a in third.attempts]
        c_dir = Path(third.run_dir) / "attempts" / key
    attempts = {"A": runs[0].attempt_dir, "B": runs[1].attempt_dir, "C": c_dir}
    ids = {"A": runs[0].trial_id, "B": runs[1].trial_id, "C": third.id}
    for name, folder in attempts.items():
        w = EventWriter(folder, "user-r0")  # file 00000000 of each: good
        w.add("metric", step=1, metrics={"loss": 0.5 + len(name)})
        w.flush()
    outside = tmp_path / "outside"
    EventWriter(outside, "user-r0").publish([{"type": "metric", "step": 9, "metrics": {"x": 1}}])
    try:
        yield World(store, home, attempts, ids, outside / "user-r0-00000000.jsonl")
    finally:
        store.close()


def _no_hang(seconds: int = 60) -> contextlib.AbstractContextManager[None]:
    """A read that blocks (a FIFO opened without O_NONBLOCK) fails the test, not hangs it."""
    return time_bound(seconds, lambda: AssertionError(f"blocked for over {seconds} s"))


def _tick(w: World) -> TickReport:
    with _no_hang():
        report = tick(w.store, stress_pool(w.home))
    assert not report.lease_held_elsewhere
    return report


def _check_quarantined(w: World, bad: Path, first: TickReport, second: TickReport) -> None:
    named = [e for e in first.errors if str(bad) in e]
    assert len(named) == 1, first.errors
    assert f"trial {w.trial_ids['A']}: quarantined {bad}: " in named[0]
    assert "\n" not in named[0]
    assert not [e for e in second.errors if str(bad) in e]  # exactly once
    with w.store.read() as s:
        trial_of_metric = dict(s.execute(select(Metric.trial_id, Metric.value)).all())
        assert set(trial_of_metric) == set(w.trial_ids.values())  # every good file
        marked = (
            s.execute(select(IngestedFile.records).where(IngestedFile.name == BAD)).scalars().all()
        )
        assert marked == [0]
        told = s.scalar(
            select(func.count()).where(
                Event.kind == "ingest.quarantined", Event.trial_id == w.trial_ids["A"]
            )
        )
        assert told == 1
        exps = status_data(s).to_json()["experiments"]
    errors = {t["id"]: t["error"] for e in exps for t in e["trials"]}
    assert str(bad) in errors[w.trial_ids["A"]]
    assert not errors[w.trial_ids["B"]] and not errors[w.trial_ids["C"]]


@pytest.mark.parametrize("case", sorted(CONTENT))
def test_a_bad_event_file_is_quarantined_once_and_the_tick_goes_on(
    world: World, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(events_module, "EVENT_FILE_LIMIT", 1024)
    bad = world.attempts["A"] / BAD
    bad.write_bytes(CONTENT[case])
    first = _tick(world)
    _check_quarantined(world, bad, first, _tick(world))


@pytest.mark.parametrize("case", sorted(LINKS))
def test_a_link_or_fifo_is_never_followed_nor_opened_to_block(
    world: World, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = world.attempts["A"] / BAD
    LINKS[case](bad, world.outside)
    first = _tick(world)
    _check_quarantined(world, bad, first, _tick(world))
    monkeypatch.setenv("DLHPC_HOME", str(world.home))
    monkeypatch.setenv("DLHPC_SITE", "local")
    with world.store.read() as s:
        exp_id = s.scalar(select(Trial.experiment_id).where(Trial.id == world.trial_ids["A"]))
    shown = run("status", str(exp_id))  # what a person sees: the trial and its file
    assert shown.exit_code == 0, shown.output
    assert f"trial {world.trial_ids['A']}: quarantined" in shown.output
    assert BAD in "".join(shown.output.split())
    with world.store.read() as s:
        assert s.scalar(select(Metric.id).where(Metric.step == 9)) is None  # not followed


def test_an_attempt_folder_that_does_not_list_stops_no_other(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocked, real = world.attempts["A"], os.listdir

    def listdir(path: str | os.PathLike[str] = ".") -> list[str]:
        if Path(path) == blocked:  # as a job's chmod 000 does (the tests may run as root)
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(os, "listdir", listdir)
    report = _tick(world)
    assert [e for e in report.errors if "not listed" in e and str(blocked) in e], report.errors
    with world.store.read() as s:
        ingested = set(s.scalars(select(Metric.trial_id)))
    assert ingested == {world.trial_ids["B"], world.trial_ids["C"]}


HEARTBEATS: dict[str, Callable[[Path], object]] = {
    "symlink to /dev/zero": lambda p: p.symlink_to("/dev/zero"),
    "FIFO": lambda p: os.mkfifo(p),
    "malformed JSON": lambda p: p.write_text('{"time": '),
    "list": lambda p: p.write_text("[1]"),
    "deep nesting": lambda p: p.write_text("[" * DEEP + "]" * DEEP),
    "oversize": lambda p: p.write_text(json.dumps({"time": 1.0, "pad": "x" * 100_000})),
    "time 1e400": lambda p: p.write_text('{"time": -1e400}'),
    "time 10**400": lambda p: p.write_text(json.dumps({"time": -(10**400)})),
}


@pytest.mark.parametrize("case", sorted(HEARTBEATS))
def test_a_bad_heartbeat_counts_as_none_with_a_warning(world: World, case: str) -> None:
    beat = world.attempts["A"] / HEARTBEAT_FILE
    HEARTBEATS[case](beat)
    report = _tick(world)
    assert not [e for e in report.errors if BAD in e]
    unreadable = case.startswith("time")  # read, but its time is no time: no heartbeat
    assert unreadable or [e for e in report.errors if str(beat) in e], report.errors
    with world.store.read() as s:  # ingest and decide ran for every trial
        assert len(s.execute(select(Metric.trial_id)).all()) == 3
        states = set(s.scalars(select(Trial.state)))
    assert states == {"RUNNING"}


@pytest.mark.parametrize("case", sorted(k for k in HEARTBEATS if not k.startswith("time")))
def test_a_bad_progress_file_reads_as_unsafe_never_blocking(tmp_path: Path, case: str) -> None:
    path = tmp_path / PROGRESS_FILE
    HEARTBEATS[case](path)
    with _no_hang(), pytest.raises(UnsafeFile, match=PROGRESS_FILE):
        read_state_file(path)
    with _no_hang():
        assert read_small_json(path) is None


MANIFESTS: dict[str, Callable[[Path], object]] = {
    "symlink to /dev/zero": lambda p: p.symlink_to("/dev/zero"),
    "FIFO": lambda p: os.mkfifo(p),
    "deep nesting": lambda p: p.write_text("[" * DEEP + "]" * DEEP),
    "size 10**400": lambda p: p.write_text(
        p.read_text().replace('"size": 100', f'"size": {10**400}')
    ),
    "created 10**400": lambda p: p.write_text(
        json.dumps({**json.loads(p.read_text()), "created": 10**400})
    ),
}


@pytest.mark.parametrize("case", sorted(MANIFESTS))
def test_a_bad_checkpoint_manifest_is_torn_not_a_crash(tmp_path: Path, case: str) -> None:
    def weights(byte: bytes) -> Callable[[Path], None]:
        def write(folder: Path) -> None:
            (folder / "w").write_bytes(byte * 100)

        return write

    good = publish_checkpoint(tmp_path, 1, weights(b"a"))
    bad = publish_checkpoint(tmp_path, 2, weights(b"b"))
    manifest = bad.path / MANIFEST_NAME
    if case in ("symlink to /dev/zero", "FIFO"):
        manifest.unlink()
    MANIFESTS[case](manifest)
    with _no_hang():
        best, torn = latest_verified(tmp_path)
    assert best == good
    assert [t.path for t in torn] == [bad.path]
    assert "manifest" in torn[0].reason
