"""The batch script names its tasks' trial folders by file, not inline: its length
does not grow with the array (Slurm refuses a batch script over 4 MB, which a site
with a large MaxArraySize could reach), each task reads its own line of the chunk's
list (written atomically before sbatch runs), and a path a shell would expand stays
text."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest

from dlhpc.errors import SchedulerError
from dlhpc.scheduler.slurm.sbatch import build_submission, submit_array, trial_list_text
from tests.unit.test_scheduler_slurm import make_request

_TASK_LINES = "# dlhpc: this task's trial folder"


def test_the_script_does_not_grow_with_the_array(tmp_path: Path) -> None:
    small = build_submission(make_request(tmp_path, 2), 0)
    huge = build_submission(make_request(tmp_path, 40_000), 0)
    assert len(trial_list_text(huge.trial_dirs)) > 2 * 2**20  # what the script once held
    assert len(huge.script) < 4096 and abs(len(huge.script) - len(small.script)) < 32
    assert huge.trial_list != small.trial_list  # named by its content
    assert huge.trial_list == build_submission(make_request(tmp_path, 40_000), 0).trial_list


def _task_folder(script: str, task: int, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run the script's lines that read the task's trial folder, as bash would."""
    start = script.index(_TASK_LINES)
    lines = script[start : script.index("\nfi\n", start) + 4]
    return subprocess.run(
        ["bash", "-c", lines + 'printf "%s" "$_dlhpc_trial"'],
        env={"PATH": "/usr/bin:/bin", "SLURM_ARRAY_TASK_ID": str(task)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_each_task_reads_its_own_line_as_text(tmp_path: Path) -> None:
    root = tmp_path / "a b'$(touch PWNED)\"`x` ;*"
    req = make_request(root, 3)
    sub = build_submission(req, 0)
    assert str(root) not in sub.script  # not inline: only the list's path is
    sub.trial_list.parent.mkdir(parents=True)
    sub.trial_list.write_text(trial_list_text(sub.trial_dirs), encoding="utf-8")
    for task, folder in enumerate(req.trial_dirs):
        proc = _task_folder(sub.script, task, tmp_path)
        assert (proc.returncode, proc.stdout, proc.stderr) == (0, str(folder), "")
    beyond = _task_folder(sub.script, 3, tmp_path)
    assert beyond.stdout == "" and "dlhpc: no line 3 in" in beyond.stderr
    assert not list(tmp_path.rglob("PWNED"))


def test_a_trial_folder_with_a_newline_is_refused(tmp_path: Path) -> None:
    req = make_request(tmp_path / "a\nb", 1)
    with pytest.raises(SchedulerError, match="holds a newline"):
        build_submission(req, 0)


def test_submit_writes_the_list_before_sbatch_runs(tmp_path: Path) -> None:
    req = make_request(tmp_path, 2)
    sub = build_submission(req, 0)
    seen: list[str] = []

    def sbatch(script: Path) -> str:
        seen.append(sub.trial_list.read_text(encoding="utf-8"))
        assert not list(sub.folder.glob(".trial-folders-*.tmp"))  # published whole
        return "Submitted batch job 42"

    assert submit_array(sub, print, sbatch) == ["42_0", "42_1"]
    assert seen == [trial_list_text(req.trial_dirs)]
    again = dataclasses.replace(sub)
    with pytest.raises(SchedulerError):  # a failed submission of the same chunk...
        submit_array(again, print, lambda script: "no id")
    assert sub.trial_list.exists()  # ...keeps the list the queued one reads
