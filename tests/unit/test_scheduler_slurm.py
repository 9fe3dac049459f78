"""SlurmScheduler against fake Slurm commands (small scripts first on PATH)."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import pickle
import shlex
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest

from dlhpc.config.schema import PreemptionConfig, Resources, SiteConfig
from dlhpc.errors import SchedulerError
from dlhpc.protocol import REQUEUE_REQUEST_FILE, read_event_batches
from dlhpc.scheduler import JobRequest, JobState, SlurmScheduler, make_scheduler
from dlhpc.scheduler.slurm.parse import (
    expand_job_id,
    map_state,
    parse_exit_code,
    parse_max_array_size,
    parse_sacct,
    parse_squeue,
    parse_time,
)
from dlhpc.scheduler.slurm.sbatch import build_submission, parse_sbatch_args, trial_list_text


def stand_in(trial_dir: str) -> None:
    """The in-job callable the tests submit (never run: sbatch is fake)."""
    (Path(trial_dir) / "ran.txt").write_text("ok", encoding="utf-8")


def asks_requeue(trial_dir: str) -> None:
    """The in-job callable as the worker ends after the time-limit signal: its request
    in the run's attempt folder (task 1 of array 100, first run)."""
    attempt = Path(trial_dir) / "attempts" / "100_1.r0"
    attempt.mkdir(parents=True)
    (attempt / REQUEUE_REQUEST_FILE).write_text("{}", encoding="utf-8")


# --- fake Slurm -------------------------------------------------------------

_SCRIPTS = {
    "scontrol": """
echo "scontrol $*" >> "$FAKE/calls.log"
[ -f "$FAKE/scontrol_fail" ] && { echo "scontrol: error: no controller" >&2; exit 1; }
echo "Configuration data as of 2024-01-01T00:00:00"
echo "MaxArraySize            = ${FAKE_MAX_ARRAY:-1001}"
echo "MaxJobCount             = 10000"
""",
    "sbatch": """
echo "sbatch $*" >> "$FAKE/calls.log"
n=$(cat "$FAKE/next_id" 2>/dev/null || echo 100)
if [ -f "$FAKE/sbatch_fail_at" ] && [ "$n" = "$(cat "$FAKE/sbatch_fail_at")" ]; then
  echo "sbatch: error: Batch job submission failed: Invalid partition" >&2
  echo "name specified" >&2
  exit 1
fi
mkdir -p "$FAKE/sbatch"
cp "$1" "$FAKE/sbatch/$n.sh"
echo $((n + 1)) > "$FAKE/next_id"
echo "Submitted batch job $n"
""",
    "squeue": """
echo "squeue $*" >> "$FAKE/calls.log"
if [ -f "$FAKE/squeue_fail" ]; then
  printf 'squeue: error: Unable to contact\\nslurm controller\\n' >&2
  exit 1
fi
cat "$FAKE/squeue.out" 2>/dev/null
exit 0
""",
    "sacct": """
echo "sacct $*" >> "$FAKE/calls.log"
mode=$(cat "$FAKE/sacct_mode" 2>/dev/null)
[ "$mode" = hang ] && exec sleep 30
[ "$mode" = fail ] && { echo "sacct: error: Slurm accounting storage is disabled" >&2; exit 1; }
cat "$FAKE/sacct.out" 2>/dev/null
exit 0
""",
    "scancel": """
echo "scancel $*" >> "$FAKE/calls.log"
cat "$FAKE/scancel.err" >&2 2>/dev/null
exit $(cat "$FAKE/scancel_rc" 2>/dev/null || echo 0)
""",
}


@dataclass
class FakeSlurm:
    dir: Path

    def put(self, name: str, text: str) -> None:
        (self.dir / name).write_text(text, encoding="utf-8")

    def calls(self, name: str | None = None) -> list[str]:
        log = self.dir / "calls.log"
        lines = log.read_text(encoding="utf-8").splitlines() if log.exists() else []
        return [c for c in lines if name is None or c.split()[0] == name]

    def submitted(self, job_id: str) -> str:
        return (self.dir / "sbatch" / f"{job_id}.sh").read_text(encoding="utf-8")


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSlurm]:
    bindir = tmp_path / "fakebin"
    bindir.mkdir()
    for name, body in _SCRIPTS.items():
        path = bindir / name
        path.write_text("#!/bin/bash\n" + body, encoding="utf-8")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    state = tmp_path / "fakestate"
    state.mkdir()
    monkeypatch.setenv("FAKE", str(state))
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("FAKE_MAX_ARRAY", raising=False)
    yield FakeSlurm(state)


def make_request(
    tmp_path: Path,
    n: int,
    *,
    max_concurrent: int = 0,
    site_max: int | None = None,
    resources: Resources | None = None,
    env: dict[str, str] | None = None,
) -> JobRequest:
    dirs = [tmp_path / "trials" / f"trial-{i:06d}" for i in range(n)]
    return JobRequest(
        experiment_id=7,
        name="dlhpc-e7-abc123",
        folder=tmp_path / "slurm",
        trial_dirs=dirs,
        resources=resources or Resources(partition="gpu", mem="4G", time_minutes=30),
        preemption=PreemptionConfig(signal="USR2", lead_time_s=120),
        site=SiteConfig(name="test", source=None, max_array_size=site_max),
        max_concurrent=max_concurrent,
        env=env or {},
    )


# --- parsing -----------------------------------------------------------------


def test_expand_job_id() -> None:
    assert expand_job_id("123_4") == ["123_4"]
    assert expand_job_id("123") == ["123"]
    assert expand_job_id("123_[5-9%2]") == [f"123_{i}" for i in range(5, 10)]
    assert expand_job_id("123_[1,3,7-8]") == ["123_1", "123_3", "123_7", "123_8"]
    assert expand_job_id("123_[4]") == ["123_4"]
    assert expand_job_id("123.batch") == []
    assert expand_job_id("123+0") == []
    assert expand_job_id("123_[5-]") == []


@pytest.mark.parametrize(
    ("raw", "state", "word"),
    [
        ("PENDING", JobState.PENDING, "PENDING"),
        ("RUNNING", JobState.RUNNING, "RUNNING"),
        ("COMPLETING", JobState.RUNNING, "COMPLETING"),
        ("SUSPENDED", JobState.RUNNING, "SUSPENDED"),
        ("REQUEUED", JobState.REQUEUED, "REQUEUED"),
        ("REQUEUE_HOLD", JobState.REQUEUED, "REQUEUE_HOLD"),
        ("COMPLETED", JobState.COMPLETED, "COMPLETED"),
        ("FAILED", JobState.FAILED, "FAILED"),
        ("OUT_OF_MEMORY", JobState.FAILED, "OUT_OF_MEMORY"),
        ("BOOT_FAIL", JobState.FAILED, "BOOT_FAIL"),
        ("CANCELLED by 0", JobState.CANCELLED, "CANCELLED"),
        ("CANCELLED+", JobState.CANCELLED, "CANCELLED"),
        ("TIMEOUT", JobState.TIMEOUT, "TIMEOUT"),
        ("PREEMPTED", JobState.PREEMPTED, "PREEMPTED"),
        ("NODE_FAIL", JobState.NODE_FAIL, "NODE_FAIL"),
        ("WEIRD_NEW_STATE", JobState.UNKNOWN, "WEIRD_NEW_STATE"),
    ],
)
def test_map_state(raw: str, state: JobState, word: str) -> None:
    assert map_state(raw)[:2] == (state, word)


def test_exit_codes_and_times() -> None:
    assert parse_exit_code("0:0") == 0
    assert parse_exit_code("1:0") == 1
    assert parse_exit_code("0:15") == 143
    assert parse_exit_code("2:9") == 2
    assert parse_exit_code("") is None
    assert parse_time("2024-05-01T12:00:01") == datetime(2024, 5, 1, 12, 0, 1)
    for none in ("Unknown", "None", "N/A", ""):
        assert parse_time(none) is None
    assert parse_max_array_size("MaxArraySize            = 40001\n") == 40001
    assert parse_max_array_size("MaxJobCount = 3\n") is None


SQUEUE = """\
123_0|RUNNING|None|node1|2024-05-01T12:00:00|2024-05-01T13:00:00
123_[5-9%2]|PENDING|JobArrayTaskLimit||N/A|N/A
123_1|PENDING|BeginTime||2024-05-01T12:30:00|N/A
123_2|REQUEUE_HOLD|job requeued in held state||N/A|N/A
123_3|COMPLETED|None|node2|2024-05-01T11:00:00|2024-05-01T11:30:00
99|RUNNING|None|node2|2024-05-01T10:00:00|2024-05-01T14:00:00
garbage line
"""

SACCT = """\
124_0|COMPLETED|0:0|node1|2024-05-01T10:00:00|2024-05-01T10:05:00|None
124_1|FAILED|1:0|node2|2024-05-01T10:00:00|2024-05-01T10:01:00|None
124_2|OUT_OF_MEMORY|0:125|node1|2024-05-01T10:00:00|2024-05-01T10:02:00|None
124_3|CANCELLED by 1000|0:15|node1|2024-05-01T10:00:00|2024-05-01T10:03:00|None
124_4|TIMEOUT|0:0|node2|2024-05-01T10:00:00|2024-05-01T10:30:00|None
124_5|NODE_FAIL|0:0|node2|2024-05-01T10:00:00|2024-05-01T10:04:00|None
124_6|PREEMPTED|0:0|node2|2024-05-01T10:00:00|2024-05-01T10:04:00|None
124_7|REQUEUED|0:0|node1|2024-05-01T10:00:00|2024-05-01T10:04:00|None
124_8|CANCELLED by 0|0:0|None assigned|Unknown|2024-05-01T10:04:00|None
124_[9-11]|PENDING|0:0|None assigned|Unknown|Unknown|Dependency
"""


def test_parse_squeue() -> None:
    q = parse_squeue(SQUEUE)
    assert q["123_0"].state is JobState.RUNNING
    assert q["123_0"].start == datetime(2024, 5, 1, 12)
    assert q["123_0"].end is None  # expected end is not a fact
    assert q["123_0"].node_list == "node1" and q["123_0"].reason == ""
    for i in range(5, 10):
        assert q[f"123_{i}"].state is JobState.PENDING
        assert q[f"123_{i}"].reason == "JobArrayTaskLimit"
    assert q["123_1"].start is None  # expected start of a pending job is dropped
    assert q["123_2"].state is JobState.REQUEUED
    assert q["123_3"].state is JobState.COMPLETED and q["123_3"].end is not None
    assert q["99"].state is JobState.RUNNING
    assert len(q) == 10


def test_parse_sacct() -> None:
    a = parse_sacct(SACCT)
    assert (a["124_0"].state, a["124_0"].exit_code) == (JobState.COMPLETED, 0)
    assert a["124_0"].end == datetime(2024, 5, 1, 10, 5)
    assert (a["124_1"].state, a["124_1"].exit_code) == (JobState.FAILED, 1)
    assert (a["124_2"].state, a["124_2"].raw_state) == (JobState.FAILED, "OUT_OF_MEMORY")
    assert a["124_3"].state is JobState.CANCELLED
    assert a["124_3"].reason == "CANCELLED by 1000" and a["124_3"].exit_code == 143
    assert a["124_4"].state is JobState.TIMEOUT
    assert a["124_5"].state is JobState.NODE_FAIL
    assert a["124_6"].state is JobState.PREEMPTED
    assert a["124_7"].state is JobState.REQUEUED and a["124_7"].exit_code is None
    assert a["124_8"].start is None and a["124_8"].node_list == ""
    for i in (9, 10, 11):
        assert a[f"124_{i}"].state is JobState.PENDING and a[f"124_{i}"].reason == "Dependency"


# --- poll ---------------------------------------------------------------------


def test_poll_one_squeue_one_sacct_for_500_ids(fake: FakeSlurm) -> None:
    fake.put("squeue.out", "".join(f"500_{i}|RUNNING|None|node1|N/A|N/A\n" for i in range(250)))
    fake.put(
        "sacct.out",
        "".join(f"500_{i}|COMPLETED|0:0|node1|N/A|N/A|None\n" for i in range(250, 400))
        + "501_[0-99]|PENDING|0:0|None assigned|Unknown|Unknown|None\n",
    )
    ids = [f"500_{i}" for i in range(400)] + [f"501_{i}" for i in range(100)]
    sched = SlurmScheduler(fn=stand_in)
    got = sched.poll(ids)
    assert len(got) == 500
    assert sum(s.state is JobState.RUNNING for s in got.values()) == 250
    assert sum(s.state is JobState.COMPLETED for s in got.values()) == 150
    assert sum(s.state is JobState.PENDING for s in got.values()) == 100
    assert len(fake.calls("squeue")) == 1 and len(fake.calls("sacct")) == 1
    assert sched.calls == {"squeue": 1, "sacct": 1}
    (squeue,) = fake.calls("squeue")
    assert "--array" in squeue and "--noheader" in squeue and "--user=" in squeue
    (sacct,) = fake.calls("sacct")
    assert "--jobs=500,501 " in sacct + " " and "-X" in sacct.split()


def test_poll_live_jobs_need_no_sacct(fake: FakeSlurm) -> None:
    fake.put("squeue.out", SQUEUE)
    sched = SlurmScheduler(fn=stand_in)
    got = sched.poll(["123_0", "123_7", "123_2"])
    assert [got[i].state for i in ("123_0", "123_7", "123_2")] == [
        JobState.RUNNING,
        JobState.PENDING,
        JobState.REQUEUED,
    ]
    assert fake.calls("sacct") == []
    assert sched.poll([]) == {}
    assert len(fake.calls("squeue")) == 1


def test_poll_merges_squeue_and_lagging_accounting(fake: FakeSlurm) -> None:
    fake.put(
        "squeue.out",
        "7_0|COMPLETED|None|node1|2024-05-01T10:00:00|2024-05-01T10:01:00\n"
        "7_1|FAILED|NonZeroExitCode|node1|2024-05-01T10:00:00|2024-05-01T10:01:00\n",
    )
    fake.put(
        "sacct.out",
        "7_0|RUNNING|0:0|node1|2024-05-01T10:00:00|Unknown|None\n"
        "7_1|FAILED|2:0|node1|2024-05-01T10:00:00|2024-05-01T10:01:00|None\n",
    )
    got = SlurmScheduler(fn=stand_in).poll(["7_0", "7_1"])
    assert (got["7_0"].state, got["7_0"].exit_code) == (JobState.COMPLETED, 0)
    assert (got["7_1"].state, got["7_1"].exit_code) == (JobState.FAILED, 2)
    assert len(fake.calls("sacct")) == 1


def test_poll_forgotten_ids_are_unknown(fake: FakeSlurm) -> None:
    got = SlurmScheduler(fn=stand_in).poll(["77_0", "78"])
    assert {s.state for s in got.values()} == {JobState.UNKNOWN}


@pytest.mark.parametrize("mode", ["fail", "hang"])
def test_poll_without_accounting(
    fake: FakeSlurm, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    fake.put("squeue.out", SQUEUE)
    fake.put("sacct_mode", mode)
    sched = SlurmScheduler(fn=stand_in, command_timeout_s=1.0)
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING):
        got = sched.poll(["123_0", "123_3", "124_1"])
        again = sched.poll(["124_1"])
    assert time.monotonic() - t0 < 5
    assert got["123_0"].state is JobState.RUNNING
    assert got["123_3"].state is JobState.COMPLETED  # squeue's view of a finished job
    assert got["124_1"].state is JobState.UNKNOWN
    assert again["124_1"].state is JobState.UNKNOWN
    assert len(fake.calls("sacct")) == 1  # not called again
    assert not sched.accounting_available
    assert sum("accounting unavailable" in r.getMessage() for r in caplog.records) == 1


def test_squeue_failure_raises_one_line(fake: FakeSlurm) -> None:
    fake.put("squeue_fail", "")
    with pytest.raises(SchedulerError) as info:
        SlurmScheduler(fn=stand_in).poll(["1_0"])
    assert "\n" not in str(info.value)
    assert "Unable to contact slurm controller" in str(info.value)


def test_bad_ids_rejected(fake: FakeSlurm) -> None:
    sched = SlurmScheduler(fn=stand_in)
    for bad in ("local-abcd1234_0", "--all", "12_x"):
        with pytest.raises(ValueError):
            sched.poll([bad])
        with pytest.raises(ValueError):
            sched.cancel([bad])
    assert fake.calls() == []


# --- render / submit -------------------------------------------------------------


def test_render_text(fake: FakeSlurm, tmp_path: Path) -> None:
    res = Resources(
        partition="gpu",
        account="lab",
        gpus_per_node=2,
        cpus_per_task=4,
        mem="16G",
        time_minutes=90,
        sbatch_args=("--exclusive", "--mail-type=END"),
    )
    req = make_request(
        tmp_path, 5, max_concurrent=2, resources=res, env={"A": "x y", "B": "$(rm -rf /)'"}
    )
    (text,) = SlurmScheduler(fn=stand_in).render(req)
    lines = text.splitlines()
    for flag in (
        "--array=0-4%2",
        "--signal=USR2@120",  # not B: (the worker runs in a step; see sbatch.py)
        "--requeue",
        "--job-name=dlhpc-e7-abc123",
        "--partition=gpu",
        "--account=lab",
        "--gpus-per-node=2",
        "--cpus-per-task=4",
        "--mem=16G",
        "--time=90",
        "--exclusive",
        "--mail-type=END",
        "--ntasks-per-node=1",
        "--nodes=1",
    ):
        assert f"#SBATCH {flag}" in lines, flag
    assert "wckey" not in text
    assert "USR2@90" not in text
    assert sum(line.startswith("#SBATCH --signal") for line in lines) == 1
    assert "export A='x y'" in lines
    assert "export B=''\"'\"'$(rm -rf /)'\"'\"''" not in lines  # shlex, not naive quoting
    assert any(line.startswith("export B=") and "$(rm" in line for line in lines)
    (srun,) = [line for line in lines if line.startswith("srun ")]
    assert "--cpus-per-task=4" in srun  # srun gets it too (Slurm >= 22.05)
    assert not req.folder.exists()  # render creates nothing
    assert fake.calls() == ["scontrol show config"]


def test_render_defaults(fake: FakeSlurm, tmp_path: Path) -> None:
    (text,) = SlurmScheduler(fn=stand_in).render(make_request(tmp_path, 3))
    assert "#SBATCH --array=0-2%3" in text  # no throttle: the chunk size
    assert "gpus" not in text
    assert "# setup" not in text


def test_submit_single_task_is_an_array(fake: FakeSlurm, tmp_path: Path) -> None:
    req = make_request(tmp_path, 1)
    sched = SlurmScheduler(fn=stand_in)
    (text,) = sched.render(req)
    (task,) = sched.submit(req)
    assert task.job_id == "100_0"
    assert task.trial_dir == req.trial_dirs[0]
    assert task.stdout == req.folder / "100_0_0_log.out"
    assert task.stderr == req.folder / "100_0_0_log.err"
    assert "#SBATCH --array=0-0%1" in text
    assert (req.folder / "100_0_submitted.pkl").exists()
    # render == what sbatch got == what submit kept in the folder
    assert fake.submitted("100") == text
    assert (req.folder / "100_submission.sh").read_text(encoding="utf-8") == text
    assert not list(req.folder.glob("*.pkl"))[1:]  # just the one pickle


def test_script_format(fake: FakeSlurm, tmp_path: Path) -> None:
    """The whole text: submitit's SlurmExecutor format, the worker in an srun step, then
    the requeue the trial asked for, and the step's status as the script's."""
    request = make_request(tmp_path, 2)
    (text,) = SlurmScheduler(fn=stand_in).render(request)
    logs, trials = f"{tmp_path}/slurm/%A_%a", f"{tmp_path}/trials"
    lines = f"{trials}/trial-000000\n{trials}/trial-000001\n"
    assert trial_list_text(request.trial_dirs) == lines
    digest = hashlib.sha256(lines.encode()).hexdigest()[:16]
    listed = f"{tmp_path}/slurm/trial-folders-{digest}.txt"
    python = shlex.quote(sys.executable)
    assert text == "\n".join(
        [
            "#!/bin/bash",
            "",
            "# Parameters",
            "#SBATCH --array=0-1%2",
            "#SBATCH --cpus-per-task=1",
            f"#SBATCH --error={logs}_0_log.err",
            "#SBATCH --export=ALL",
            "#SBATCH --job-name=dlhpc-e7-abc123",
            "#SBATCH --mem=4G",
            "#SBATCH --nodes=1",
            "#SBATCH --ntasks-per-node=1",
            "#SBATCH --open-mode=append",
            f"#SBATCH --output={logs}_0_log.out",
            "#SBATCH --partition=gpu",
            "#SBATCH --requeue",
            "#SBATCH --signal=USR2@120",
            "#SBATCH --time=30",
            "",
            "# dlhpc: this task's trial folder, line SLURM_ARRAY_TASK_ID (from 0) of the"
            " chunk's list",
            f'mapfile -t -s "${{SLURM_ARRAY_TASK_ID:-0}}" -n 1 _dlhpc_line < {listed}',
            '_dlhpc_trial="${_dlhpc_line[0]-}"',
            'if [ -z "$_dlhpc_trial" ]; then',
            f'  echo "dlhpc: no line ${{SLURM_ARRAY_TASK_ID:-0}} in "{listed} >&2',
            "fi",
            "",
            "# command",
            "export SUBMITIT_EXECUTOR=slurm",
            f"srun --unbuffered --output {logs}_%t_log.out --error {logs}_%t_log.err "
            f"{python} -u -m submitit.core._submit {tmp_path}/slurm",
            "_dlhpc_status=$?",
            "# dlhpc: the requeue the trial asked for at the time limit, once its step has ended",
            '_dlhpc_attempt="$_dlhpc_trial"/attempts/'
            '"${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}.r${SLURM_RESTART_COUNT:-0}"',
            'if [ -e "$_dlhpc_attempt"/requeue.json ]; then',
            f'  {python} -m dlhpc.scheduler.slurm.requeue "$_dlhpc_attempt"',
            "fi",
            'exit "$_dlhpc_status"',
            "",
        ]
    )


@pytest.mark.parametrize("refused", [False, True], ids=["requeued", "refused"])
def test_the_script_requeues_the_task_its_trial_asked_for_after_the_step(
    fake: FakeSlurm, tmp_path: Path, refused: bool
) -> None:
    """The trial's request (its attempt folder's requeue file) is acted on by the batch
    shell once srun has returned: ``scontrol requeue`` of its task. A refusal is printed
    to the job's log and published in the attempt's worker stream; the script's status
    stays the step's. Folder names a shell would expand stay text."""
    root = tmp_path / "a b'$(touch PWNED)\"`x`"
    req = make_request(root, 2)
    SlurmScheduler(fn=asks_requeue).submit(req)
    for d in req.trial_dirs:
        d.mkdir(parents=True)
    if refused:
        fake.put("scontrol_fail", "")
    proc = _run_task_1(tmp_path, req)
    assert proc.returncode == 0, proc.stderr
    assert fake.calls("scontrol")[1:] == ["scontrol requeue 100_1"]  # after show config
    assert not list(tmp_path.rglob("PWNED")) and not (Path.cwd() / "PWNED").exists()
    attempt = req.trial_dirs[1] / "attempts" / "100_1.r0"
    logs = [r["message"] for b in read_event_batches(attempt) for r in b.records]
    if not refused:
        assert logs == [] and "dlhpc:" not in proc.stderr, proc.stderr
        return
    assert "dlhpc: scontrol requeue 100_1: scontrol: error: no controller" in proc.stderr
    assert logs == [
        "scontrol requeue 100_1: scontrol: error: no controller; the reconciler submits"
        " the trial again instead"
    ]


def test_render_needs_no_slurm_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A laptop: no sbatch, srun nor scontrol on PATH (MaxArraySize: the default)."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    (text,) = SlurmScheduler(fn=stand_in).render(make_request(tmp_path, 1))
    assert "#SBATCH --array=0-0%1" in text and "\nsrun " in text


def _run_task_1(tmp_path: Path, req: JobRequest) -> subprocess.CompletedProcess[str]:
    """Run the script submitted for ``req`` (array 100) as Slurm would run its task 1,
    a fake srun running the step's command."""
    srun = tmp_path / "fakebin" / "srun"
    srun.write_text('#!/bin/bash\nshift 5\nexec "$@"\n', encoding="utf-8")  # drop its options
    srun.chmod(0o755)
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": os.pathsep.join(sys.path),
        "SLURM_JOB_ID": "101",
        "SLURM_ARRAY_JOB_ID": "100",
        "SLURM_ARRAY_TASK_ID": "1",
        "SLURM_NTASKS": "1",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_NODEID": "0",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_JOB_NODELIST": "node1",
    }
    env["FAKE"] = os.environ["FAKE"]
    script = req.folder / "100_submission.sh"
    return subprocess.run(
        ["bash", str(script)], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_submitted_array_runs_through_submitits_in_job_side(
    fake: FakeSlurm, tmp_path: Path
) -> None:
    """Submit for real against the fake sbatch, then run the script it got as Slurm
    would for array task 1 (a fake srun runs the step's command): the installed
    submitit finds task 1's pickle and runs the in-job callable on trial 1. Nothing
    asked for a requeue: the script calls no scontrol."""
    req = make_request(tmp_path, 3)
    tasks = SlurmScheduler(fn=stand_in).submit(req)
    assert [t.job_id for t in tasks] == ["100_0", "100_1", "100_2"]
    for d in req.trial_dirs:
        d.mkdir(parents=True)
    proc = _run_task_1(tmp_path, req)
    assert proc.returncode == 0, proc.stderr
    assert fake.calls("scontrol") == ["scontrol show config"]  # the submission's
    ran = [d for d in req.trial_dirs if (d / "ran.txt").exists()]
    assert ran == [req.trial_dirs[1]]
    with (req.folder / "100_1_0_result.pkl").open("rb") as f:
        assert pickle.load(f) == ("success", None)


def test_submit_without_job_id_leaves_nothing(fake: FakeSlurm, tmp_path: Path) -> None:
    fake.put("next_id", "none")  # sbatch says "Submitted batch job none"
    req = make_request(tmp_path, 2)
    with pytest.raises(SchedulerError, match="sbatch gave no job id"):
        SlurmScheduler(fn=stand_in).submit(req)
    assert list(req.folder.iterdir()) == []
    assert len(fake.calls("sbatch")) == 1


def test_submit_chunks_by_max_array_size(
    fake: FakeSlurm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_MAX_ARRAY", "4")
    req = make_request(tmp_path, 10, max_concurrent=3)
    sched = SlurmScheduler(fn=stand_in)
    texts = sched.render(req)
    tasks = sched.submit(req)
    assert [t.job_id for t in tasks] == [
        "100_0", "100_1", "100_2", "100_3",
        "101_0", "101_1", "101_2", "101_3",
        "102_0", "102_1",
    ]  # fmt: skip
    assert [t.trial_dir for t in tasks] == list(req.trial_dirs)
    assert len(fake.calls("sbatch")) == 3 and len(fake.calls("scontrol")) == 1
    assert [fake.submitted(str(i)) for i in (100, 101, 102)] == texts
    # max_concurrent bounds the request: the three arrays' throttles add up to 3
    assert "#SBATCH --array=0-3%1" in texts[0] and "#SBATCH --array=0-1%1" in texts[2]
    for i in (100, 101, 102):
        assert (req.folder / f"{i}_submission.sh").read_text(encoding="utf-8") == fake.submitted(
            str(i)
        )
    assert sched.calls == {"scontrol": 1, "sbatch": 3}


def test_throttle_is_shared_among_chunks(
    fake: FakeSlurm, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sched = SlurmScheduler(fn=stand_in)
    texts = sched.render(make_request(tmp_path, 10, max_concurrent=10, site_max=4))
    arrays = [line for t in texts for line in t.splitlines() if "--array" in line]
    assert arrays == ["#SBATCH --array=0-3%4", "#SBATCH --array=0-3%3", "#SBATCH --array=0-1%2"]
    with caplog.at_level(logging.WARNING):
        texts = sched.render(make_request(tmp_path, 3, max_concurrent=2, site_max=1))
    assert all("--array=0-0%1" in t for t in texts) and len(texts) == 3
    assert "cannot run at most 2" in caplog.text


def test_site_max_array_size_lowers_chunks(fake: FakeSlurm, tmp_path: Path) -> None:
    sched = SlurmScheduler(fn=stand_in)
    assert len(sched.render(make_request(tmp_path, 5, site_max=2))) == 3
    assert sched.max_array_size() == 1001
    assert len(sched.render(make_request(tmp_path, 1001))) == 1
    assert len(sched.render(make_request(tmp_path, 1002))) == 2
    assert len(fake.calls("scontrol")) == 1  # read once per instance


def test_scontrol_failure_warns_and_assumes_default(
    fake: FakeSlurm, caplog: pytest.LogCaptureFixture
) -> None:
    fake.put("scontrol_fail", "")
    with caplog.at_level(logging.WARNING):
        assert SlurmScheduler(fn=stand_in).max_array_size() == 1001
    assert "MaxArraySize" in caplog.text


def test_failed_chunk_reports_earlier_chunks(
    fake: FakeSlurm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_MAX_ARRAY", "2")
    fake.put("sbatch_fail_at", "101")
    req = make_request(tmp_path, 5)
    with pytest.raises(SchedulerError) as info:
        SlurmScheduler(fn=stand_in).submit(req)
    err = info.value
    assert [t.job_id for t in err.submitted] == ["100_0", "100_1"]
    assert "Invalid partition name specified" in str(err) and "\n" not in str(err)
    # the failed chunk left no pickles, script or trial list behind
    leftovers = sorted(p.name for p in req.folder.iterdir() if not p.name.startswith("trial-"))
    assert leftovers == sorted(["100_0_submitted.pkl", "100_1_submitted.pkl", "100_submission.sh"])
    listed = build_submission(dataclasses.replace(req, trial_dirs=req.trial_dirs[:2]), 2)
    assert [p.name for p in req.folder.glob("trial-*")] == [listed.trial_list.name]


def test_sbatch_args_and_env_validation(fake: FakeSlurm, tmp_path: Path) -> None:
    assert parse_sbatch_args(["--exclusive", "--mail-type=END", "--comment=a b"]) == {
        "exclusive": True,
        "mail-type": "END",
        "comment": "a b",
    }
    for bad in (["-p", "x"], ["--array=0-3"], ["--output=x"], ["--wckey=x"]):
        with pytest.raises(SchedulerError):
            parse_sbatch_args(bad)
    with pytest.raises(SchedulerError):
        SlurmScheduler(fn=stand_in).render(make_request(tmp_path, 1, env={"BAD-KEY": "x"}))


# --- cancel / logs / registry ------------------------------------------------------


def test_cancel_one_call(fake: FakeSlurm) -> None:
    sched = SlurmScheduler(fn=stand_in)
    sched.cancel(["5_0", "5_1", "6_3", "5_0"])
    assert fake.calls("scancel") == ["scancel 5_0 5_1 6_3"]
    sched.cancel([])
    assert len(fake.calls("scancel")) == 1
    fake.put("scancel_rc", "1")
    fake.put(
        "scancel.err",
        "scancel: error: Kill job error on job id 5_0: Job/step already completing or completed\n"
        "scancel: error: Kill job error on job id 9: Invalid job id specified\n",
    )
    sched.cancel(["5_0", "9"])  # finished / unknown ids are ignored
    fake.put("scancel.err", "scancel: error: Kill job error on job 5_1: Access/permission denied\n")
    with pytest.raises(SchedulerError, match="permission denied"):
        sched.cancel(["5_1"])


def test_default_callable_and_empty_request(fake: FakeSlurm, tmp_path: Path) -> None:
    from dlhpc.harness.worker import run_trial

    sched = SlurmScheduler()
    assert sched._callable() is run_trial
    assert sched.render(make_request(tmp_path, 0)) == []
    assert sched.submit(make_request(tmp_path, 0)) == []
    assert fake.calls("sbatch") == []


def test_log_paths_and_registry(tmp_path: Path) -> None:
    sched = make_scheduler("slurm", local_root=tmp_path)
    assert isinstance(sched, SlurmScheduler)
    assert sched.log_paths(tmp_path, "12_3") == [
        tmp_path / "12_3_0_log.out",
        tmp_path / "12_3_0_log.err",
    ]
    with pytest.raises(ValueError, match="local, slurm"):
        make_scheduler("pbs", local_root=tmp_path)


def test_a_requeue_request_of_another_run_is_not_acted_on(fake: FakeSlurm, tmp_path: Path) -> None:
    """The batch shell's handler asks for nothing without a request, and refuses a
    request in a folder that is not this run's attempt (``<job>.r<restart>``)."""
    from dlhpc.errors import DlhpcError
    from dlhpc.scheduler.slurm.requeue import main, requeue_after_step

    env = {"SLURM_JOB_ID": "9", "SLURM_ARRAY_JOB_ID": "8", "SLURM_ARRAY_TASK_ID": "0"}
    attempt = tmp_path / "8_0.r0"
    attempt.mkdir()
    assert requeue_after_step(attempt, env) == ""
    other = tmp_path / "8_0.r1"
    other.mkdir()
    (other / REQUEUE_REQUEST_FILE).write_text("{}", encoding="utf-8")
    with pytest.raises(DlhpcError, match=r"not this run's attempt folder \(8_0\.r0\)"):
        requeue_after_step(other, env)
    assert fake.calls("scontrol") == []
    assert main([]) == 2
