"""SlurmScheduler on the real dev cluster (scripts/dev-cluster up)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dlhpc.config.schema import PreemptionConfig, Resources, SiteConfig
from dlhpc.scheduler import JobRequest, JobState, JobStatus, SlurmScheduler
from tests.integration import _cluster_fns

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster(slurm_env: dict[str, str]) -> Iterator[None]:
    """SLURM_CONF of the dev cluster the environment names (scripts/dev-cluster env or
    exec) in os.environ; slurm_env skips (fails where a cluster is required) without one."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SLURM_CONF", slurm_env["SLURM_CONF"])
        yield


@pytest.fixture
def launched(cluster: None) -> Iterator[list[str]]:
    """Job ids a test submitted; cancelled at teardown so nothing is left running."""
    ids: list[str] = []
    yield ids
    if ids:
        SlurmScheduler().cancel(ids)


def make_request(
    tmp_path: Path, n: int, *, site_max: int | None = None, time_minutes: int = 5, lead: int = 120
) -> JobRequest:
    dirs = [tmp_path / "trials" / f"trial-{i:06d}" for i in range(n)]
    for d in dirs:
        d.mkdir(parents=True)
    return JobRequest(
        experiment_id=1,
        name=f"dlhpc-sched-test-{tmp_path.name}"[:60],
        folder=tmp_path / "slurm",
        trial_dirs=dirs,
        resources=Resources(mem="100M", time_minutes=time_minutes),
        preemption=PreemptionConfig(signal="USR2", lead_time_s=lead),
        site=SiteConfig(name="dev-cluster", source=None, max_array_size=site_max),
        # the stand-ins are pickled by reference: make their module importable in the job
        env={"PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests' / 'integration'}"},
    )


def submit(
    fn: Callable[[str], None], req: JobRequest, launched: list[str]
) -> tuple[SlurmScheduler, list[str]]:
    sched = SlurmScheduler(fn=fn)
    ids = [t.job_id for t in sched.submit(req)]
    launched.extend(ids)
    return sched, ids


def poll_until(
    sched: SlurmScheduler,
    ids: list[str],
    done: Callable[[dict[str, JobStatus]], bool],
    timeout: float,
) -> dict[str, JobStatus]:
    """Poll every second; every poll must cost at most one squeue and one sacct."""
    deadline = time.monotonic() + timeout
    while True:
        before = sched.calls["squeue"] + sched.calls["sacct"]
        got = sched.poll(ids)
        assert sched.calls["squeue"] + sched.calls["sacct"] - before <= 2
        if done(got):
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s: {got}")
        time.sleep(1)


def all_in(*states: JobState) -> Callable[[dict[str, JobStatus]], bool]:
    return lambda got: all(s.state in states for s in got.values())


def test_array_runs_and_submitted_script_equals_render(launched: list[str], tmp_path: Path) -> None:
    req = make_request(tmp_path, 3)
    (rendered,) = SlurmScheduler(fn=_cluster_fns.write_marker).render(req)
    sched, ids = submit(_cluster_fns.write_marker, req, launched)
    base = ids[0].split("_")[0]
    assert ids == [f"{base}_{i}" for i in range(3)]
    assert sched.calls["sbatch"] == 1
    assert (req.folder / f"{base}_submission.sh").read_text(encoding="utf-8") == rendered
    got = poll_until(sched, ids, all_in(JobState.COMPLETED), timeout=120)
    assert all(s.exit_code == 0 for s in got.values())
    for jid, trial in zip(ids, req.trial_dirs, strict=True):
        assert (trial / "done.txt").read_text(encoding="utf-8") == jid


def test_single_task_is_an_array(launched: list[str], tmp_path: Path) -> None:
    req = make_request(tmp_path, 1)
    sched, (jid,) = submit(_cluster_fns.write_marker, req, launched)
    assert jid.endswith("_0")
    poll_until(sched, [jid], all_in(JobState.COMPLETED), timeout=120)
    assert (req.trial_dirs[0] / "done.txt").read_text(encoding="utf-8") == jid


def test_split_by_site_max_array_size(launched: list[str], tmp_path: Path) -> None:
    req = make_request(tmp_path, 5, site_max=2)
    sched, ids = submit(_cluster_fns.write_marker, req, launched)
    assert sched.calls["sbatch"] == 3
    assert len({jid.split("_")[0] for jid in ids}) == 3
    assert [jid.split("_")[1] for jid in ids] == ["0", "1", "0", "1", "0"]
    poll_until(sched, ids, all_in(JobState.COMPLETED), timeout=120)
    assert all((d / "done.txt").exists() for d in req.trial_dirs)


def test_cancel_running_task(launched: list[str], tmp_path: Path) -> None:
    req = make_request(tmp_path, 1)
    sched, (jid,) = submit(_cluster_fns.sleep_long, req, launched)
    deadline = time.monotonic() + 120
    while not (req.trial_dirs[0] / "started.txt").exists():
        assert time.monotonic() < deadline, sched.poll([jid])
        time.sleep(1)
    sched.cancel([jid])
    got = poll_until(sched, [jid], all_in(JobState.CANCELLED), timeout=90)
    assert got[jid].raw_state == "CANCELLED"


def test_time_limit_signal_reaches_the_worker(launched: list[str], tmp_path: Path) -> None:
    """--signal=USR2@60 (not B:USR2) reaches the process srun runs, ahead of the limit."""
    req = make_request(tmp_path, 1, time_minutes=2, lead=60)
    sched, (jid,) = submit(_cluster_fns.record_signals, req, launched)
    log = req.trial_dirs[0] / "signals.txt"
    deadline = time.monotonic() + 240
    while "SIGUSR2" not in (log.read_text(encoding="utf-8") if log.exists() else ""):
        assert time.monotonic() < deadline, (sched.poll([jid]), log.exists() and log.read_text())
        time.sleep(2)
    status = sched.poll([jid])[jid]
    assert status.state in (JobState.RUNNING, JobState.REQUEUED, JobState.PENDING)
