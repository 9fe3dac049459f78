"""``dlhpc logs``: an attempt's log, whichever way the attempt came to be."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from dlhpc.cli.main import cli
from dlhpc.protocol import EventWriter
from dlhpc.store import Store, Trial, utcnow
from dlhpc.store.ingest import ingest_attempts, new_attempt
from tests.unit._db import exp_and_trial, submitted_attempt


def _logs(*args: str) -> Result:
    return CliRunner().invoke(cli, ["logs", *args], catch_exceptions=False)


def _ingest(store: Store, tid: int, folder: Path) -> None:
    w = EventWriter(folder, "worker-r0")
    w.add("start", host="n")
    w.flush()
    with store.write() as s:
        t = s.get(Trial, tid)
        assert t is not None
        ingest_attempts(s, [(t, folder)], utcnow())


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    monkeypatch.setenv("DLHPC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DLHPC_SITE", "local")
    return Store(tmp_path / "home")


def test_a_job_the_scheduler_requeued_shows_its_log_with_every_run(
    home: Store, tmp_path: Path
) -> None:
    tid = exp_and_trial(home, tmp_path)
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "55_0_0_log.out").write_text("run 0: epoch 1\nrun 1: resumed at epoch 1\n")
    (jobs / "55_0_0_log.err").write_text("run 0 err\nrun 1 err\n")
    submitted_attempt(home, tid, "55_0.r0", str(jobs), str(jobs / "55_0_0_log.out"))
    _ingest(home, tid, tmp_path / "t" / "attempts" / "55_0.r1")  # Slurm's requeue: same id
    res = _logs(str(tid))
    assert res.exit_code == 0 and res.output == "run 0: epoch 1\nrun 1: resumed at epoch 1\n"
    res = _logs(str(tid), "--stderr")
    assert res.exit_code == 0 and res.output == "run 0 err\nrun 1 err\n"
    # the trial submitted again as a new job: its newest log, or an earlier one by key
    (jobs / "60_0_0_log.out").write_text("run 2: resumed at epoch 2\n")
    submitted_attempt(home, tid, "60_0.r0", str(jobs), str(jobs / "60_0_0_log.out"))
    assert _logs(str(tid)).output == "run 2: resumed at epoch 2\n"
    for key in ("55_0.r0", "55_0.r1"):
        res = _logs(str(tid), "--attempt", key, "--stderr")
        assert res.exit_code == 0 and res.output == "run 0 err\nrun 1 err\n"
    res = CliRunner().invoke(cli, ["logs", str(tid), "--attempt", "55_0.r7"])
    assert res.exit_code == 2 and f"trial {tid} has no attempt '55_0.r7'" in res.output
    assert "['55_0.r0', '55_0.r1', '60_0.r0']" in res.output


@pytest.mark.parametrize("stream", [[], ["--stderr"], ["-f"]], ids=["stdout", "stderr", "follow"])
def test_an_attempt_without_a_recorded_log_says_so(
    home: Store, tmp_path: Path, stream: list[str]
) -> None:
    """A job's files seen before its submission was recorded (adopt fills the log in)."""
    tid = exp_and_trial(home, tmp_path)
    _ingest(home, tid, tmp_path / "t" / "attempts" / "77_0.r0")
    res = CliRunner().invoke(cli, ["logs", str(tid), *stream])
    assert res.exit_code == 1, res.output
    assert res.stderr == (
        f"error: trial {tid}: attempt 77_0.r0 (job 77_0) has no log file recorded\n"
    )


def _trial_with_log(home: Store, tmp_path: Path) -> tuple[int, Path]:
    """A trial whose one attempt's log is ``jobs/9_0_0_log.out`` (not created here)."""
    tid = exp_and_trial(home, tmp_path)
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    with home.write() as s:
        log = jobs / "9_0_0_log.out"
        s.add(new_attempt(tid, "9_0.r0", "RUNNING", utcnow(), log_path=str(log)))
    return tid, jobs / "9_0_0_log.out"


HOSTILE = (
    "epoch 1\n"
    "\x1b]52;c;ZWNobyBwd25lZA==\x07"  # OSC 52: write the clipboard
    "\x1b[2J\x1b[H"  # clear the screen, cursor home
    "\x1b]0;root@login\x1b\\"  # window title, ended by ST
    "\x9b31mred\x9b0m "  # 8-bit CSI
    "\x1b[1;32mgreen\x1b[0m\tok\r\n"
    "10%\r20%\rdone\x07\x08\n"
)


def test_terminal_control_sequences_are_removed_unless_raw(home: Store, tmp_path: Path) -> None:
    tid, log = _trial_with_log(home, tmp_path)
    log.write_text(HOSTILE, encoding="utf-8")
    res = _logs(str(tid))
    assert res.exit_code == 0
    assert res.stdout_bytes == b"epoch 1\nred green\tok\n10%\n20%\ndone\n"
    assert _logs(str(tid), "--raw").stdout_bytes == HOSTILE.encode()  # .stdout drops \r


def test_only_the_last_bytes_are_printed_and_the_rest_is_named(home: Store, tmp_path: Path) -> None:
    tid, log = _trial_with_log(home, tmp_path)
    log.write_text("".join(f"line {i:04d}\n" for i in range(1000)))  # 10 bytes a line
    res = _logs(str(tid), "--max-bytes", "30")
    assert res.exit_code == 0 and res.stdout == "line 0997\nline 0998\nline 0999\n"
    assert f"the first 9,970 bytes of {log} are not shown" in res.stderr
    assert _logs(str(tid), "--max-bytes", "0").stdout.count("\n") == 1000


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_a_log_that_is_not_a_regular_file_is_refused_at_once(
    home: Store, tmp_path: Path, kind: str
) -> None:
    """A job can replace its log: a symlink (to /dev/zero, another user's file) is never
    followed and a FIFO is never waited on."""
    tid, log = _trial_with_log(home, tmp_path)
    if kind == "symlink":
        log.symlink_to("/dev/zero")
    else:
        os.mkfifo(log)
    res = CliRunner().invoke(cli, ["logs", str(tid)])
    assert res.exit_code == 1 and res.stdout == ""
    reason = "a symbolic link" if kind == "symlink" else "not a regular file"
    assert f"not printed: {log}: {reason}" in res.stderr
