"""LocalScheduler: real detached runners running a stand-in worker (_fake_worker.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import time
from collections.abc import Collection, Iterator
from pathlib import Path

import pytest

from dlhpc.config.schema import PreemptionConfig, Resources, SiteConfig
from dlhpc.scheduler import JobRequest, JobState, JobStatus, LocalScheduler, make_scheduler
from dlhpc.scheduler.local.batch import BatchPaths, runner_alive

HERE = Path(__file__).resolve().parent


@pytest.fixture
def sched(tmp_path: Path) -> Iterator[LocalScheduler]:
    s = LocalScheduler(tmp_path / "local-root", worker_module="_fake_worker")
    yield s
    # leave no runner or task behind: kill live runners' groups and RUNNING tasks' groups
    for index in s.root.glob("*.batch"):
        paths = BatchPaths(Path(index.read_text().strip()))
        pids = [int(paths.pid.read_text())] if runner_alive(paths) else []
        for status in paths.dir.glob("status/*.json"):
            record = json.loads(status.read_text())
            if record["state"] == "RUNNING":
                pids.append(record["pid"])
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


def request(
    tmp_path: Path,
    n: int,
    *,
    max_concurrent: int = 0,
    sleep: float = 0.0,
    exit_codes: dict[int, int] | None = None,
    local_max_parallel: int | None = None,
) -> JobRequest:
    dirs = []
    for i in range(n):
        d = tmp_path / "trials" / f"trial-{i:06d}"
        d.mkdir(parents=True)
        if sleep:
            (d / "sleep").write_text(str(sleep))
        if exit_codes and i in exit_codes:
            (d / "exit").write_text(str(exit_codes[i]))
        dirs.append(d)
    return JobRequest(
        experiment_id=1,
        name="dlhpc-e1-test",
        folder=tmp_path / "exp" / "jobs",
        trial_dirs=dirs,
        resources=Resources(),
        preemption=PreemptionConfig(),
        site=SiteConfig(name="laptop", source=None, local_max_parallel=local_max_parallel),
        max_concurrent=max_concurrent,
        env={"PYTHONPATH": str(HERE), "EXTRA": "a b'c"},
    )


def wait_final(
    sched: LocalScheduler, ids: Collection[str], timeout: float = 30
) -> dict[str, JobStatus]:
    deadline = time.monotonic() + timeout
    while True:
        got = sched.poll(ids)
        if all(s.state.is_terminal for s in got.values()):
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"not final after {timeout}s: {got}")
        time.sleep(0.05)


def wait_for(path: Path, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear")
        time.sleep(0.02)


def test_tasks_complete(sched: LocalScheduler, tmp_path: Path) -> None:
    req = request(tmp_path, 3)
    (script,) = sched.render(req)
    assert not req.folder.exists() and not sched.root.exists()  # render has no side effects
    tasks = sched.submit(req)
    ids = [t.job_id for t in tasks]
    batch = ids[0].split("_")[0].removeprefix("local-")
    assert ids == [f"local-{batch}_{i}" for i in range(3)]
    assert [t.trial_dir for t in tasks] == list(req.trial_dirs)
    got = wait_final(sched, ids)
    assert {s.state for s in got.values()} == {JobState.COMPLETED}
    assert all(s.exit_code == 0 and s.start and s.end for s in got.values())
    for t in tasks:
        ran = json.loads((t.trial_dir / "ran.json").read_text())
        assert ran["job_id"] == t.job_id and ran["extra"] == "a b'c"
        assert sched.log_paths(req.folder, t.job_id) == [t.stdout, t.stderr]
        assert t.stdout.read_text() == f"fake worker {t.job_id} says hi\n"
        assert t.stderr is not None and t.stderr.read_text() == "to stderr\n"
    batch_dir = req.folder / f"local-{batch}"
    assert (batch_dir / "batch.txt").read_text() == script.replace("BATCHID", batch)
    assert "DLHPC_JOB_ID=local-BATCHID_2" in script and "-m _fake_worker" in script
    assert "export EXTRA='a b'\"'\"'c'" in script


def test_concurrency_limit(sched: LocalScheduler, tmp_path: Path) -> None:
    req = request(tmp_path, 6, max_concurrent=2, sleep=0.5)
    ids = [t.job_id for t in sched.submit(req)]
    wait_final(sched, ids)
    spans = [json.loads((d / "ran.json").read_text()) for d in req.trial_dirs]
    events = sorted([(s["start"], 1) for s in spans] + [(s["end"], -1) for s in spans])
    running = peak = 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
    assert peak == 2


def test_site_parallel_default(sched: LocalScheduler, tmp_path: Path) -> None:
    (script,) = sched.render(request(tmp_path, 2, local_max_parallel=1))
    assert "at most 1 at a time" in script


def test_failed_exit_code_seen(sched: LocalScheduler, tmp_path: Path) -> None:
    req = request(tmp_path, 2, exit_codes={1: 3})
    ids = [t.job_id for t in sched.submit(req)]
    got = wait_final(sched, ids)
    assert (got[ids[0]].state, got[ids[0]].exit_code) == (JobState.COMPLETED, 0)
    assert (got[ids[1]].state, got[ids[1]].exit_code) == (JobState.FAILED, 3)


def test_cancel_running_and_pending(sched: LocalScheduler, tmp_path: Path) -> None:
    req = request(tmp_path, 3, max_concurrent=1, sleep=60)
    ids = [t.job_id for t in sched.submit(req)]
    wait_for(req.trial_dirs[0] / "started")
    assert sched.poll(ids[:1])[ids[0]].state is JobState.RUNNING
    assert sched.poll(ids[1:2])[ids[1]].state is JobState.PENDING
    t0 = time.monotonic()
    sched.cancel(ids[:2])
    got = wait_final(sched, ids[:2], timeout=10)
    assert time.monotonic() - t0 < 5
    assert got[ids[0]].state is JobState.CANCELLED and got[ids[0]].exit_code == 128 + 15
    assert got[ids[1]].state is JobState.CANCELLED and got[ids[1]].exit_code is None
    wait_for(req.trial_dirs[2] / "started")  # the next task started, the cancelled one never
    assert not (req.trial_dirs[1] / "started").exists()
    sched.cancel(ids[2:] + ids[:1])  # finished ids are ignored
    assert wait_final(sched, ids[2:])[ids[2]].state is JobState.CANCELLED


def test_dead_runner(sched: LocalScheduler, tmp_path: Path) -> None:
    req = request(tmp_path, 2, max_concurrent=1, sleep=60)
    ids = [t.job_id for t in sched.submit(req)]
    wait_for(req.trial_dirs[0] / "started")
    batch_dir = req.folder / f"local-{ids[0].split('_')[0].removeprefix('local-')}"
    wait_for(batch_dir / "status" / "0.json")
    runner = int((batch_dir / "runner.pid").read_text())
    os.kill(runner, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while sched.poll(ids[:1])[ids[0]].state is JobState.RUNNING:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    got = sched.poll(ids)
    assert (got[ids[0]].state, got[ids[0]].reason) == (JobState.FAILED, "runner died")
    assert (got[ids[1]].state, got[ids[1]].reason) == (JobState.UNKNOWN, "runner died")


def test_unknown_and_bad_ids(sched: LocalScheduler, tmp_path: Path) -> None:
    got = sched.poll(["local-0badc0de_0"])
    assert got["local-0badc0de_0"].state is JobState.UNKNOWN
    sched.cancel(["local-0badc0de_0"])  # ignored
    with pytest.raises(ValueError):
        sched.poll(["123_4"])
    assert sched.submit(request(tmp_path, 0)) == []
    assert isinstance(make_scheduler("local", local_root=tmp_path), LocalScheduler)


def test_find_jobs_by_name(sched: LocalScheduler, tmp_path: Path) -> None:
    """The tasks of every batch submitted under a name, in submission order, as a tick
    adopting a crashed submission looks them up; none under another name."""
    first = sched.submit(request(tmp_path / "a", 2))
    sched.submit(dataclasses.replace(request(tmp_path / "b", 1), name="dlhpc-e2-other"))
    time.sleep(0.05)  # batches are ordered by their index file's time stamp
    second = sched.submit(request(tmp_path / "c", 1))
    assert sched.find_jobs("dlhpc-e1-test") == [t.job_id for t in [*first, *second]]
    assert sched.find_jobs("dlhpc-e9-none") == []
    assert LocalScheduler(tmp_path / "no-root").find_jobs("dlhpc-e1-test") == []
