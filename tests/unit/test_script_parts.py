"""The script runner's parts: the completeness rule for checkpoints, metric sources."""

from __future__ import annotations

import os
from pathlib import Path

from dlhpc.integrations.script._checkpoints import ScriptCheckpoints, resume_path, step_of
from dlhpc.integrations.script._metrics import JsonlTail, LinePattern


def test_an_entry_is_complete_after_two_equal_looks_and_in_progress_names_never(
    tmp_path: Path,
) -> None:
    script = tmp_path / "ckpt" / "script"
    (script).mkdir(parents=True)
    (script / "old.pt").write_text("earlier attempt")
    watch = ScriptCheckpoints(script, tmp_path / "ckpt")
    (script / "last.pt").write_text("a")
    (script / ".last.pt.tmp").write_text("x")
    (script / "w.part").write_text("x")
    (script / "folder").mkdir()  # empty: being filled
    assert watch.stable() == []  # first seen now
    assert watch.stable() == ["last.pt"]  # unchanged since: complete; old.pt is known
    watch.publish("last.pt", 1)
    assert watch.stable() == []  # registered
    (script / "last.pt").write_text("bb")  # rewritten in place
    (script / "folder" / "w.bin").write_bytes(b"1")
    assert watch.stable() == []
    os.utime(script / "folder" / "w.bin", ns=(1, 1))  # still being written
    assert watch.stable() == ["last.pt"]  # the folder changed since the last look
    assert sorted(watch.stable()) == ["folder", "last.pt"]
    ckpt = watch.publish("folder", 2)
    assert (ckpt.path / "folder" / "w.bin").read_bytes() == b"1"
    assert resume_path(tmp_path / "ckpt") == str(ckpt.path / "folder")
    assert watch.changed() == ["last.pt"]  # a clean exit takes what is there


def test_a_registered_copy_survives_the_script_rewriting_its_file(tmp_path: Path) -> None:
    script = tmp_path / "ckpt" / "script"
    watch = ScriptCheckpoints(script, tmp_path / "ckpt")
    (script / "last.pt").write_text("epoch 1")
    ckpt = watch.publish("last.pt", 1)
    with open(script / "last.pt", "w") as f:  # truncates the same inode
        f.write("ep")
    assert resume_path(tmp_path / "ckpt") == str(ckpt.path / "last.pt")
    assert (ckpt.path / "last.pt").read_text() == "epoch 1"


def test_step_of_an_entry_name() -> None:
    assert step_of("epoch-12.pt", 5) == 12
    assert step_of("ckpt_v2_step0300", 5) == 300
    assert step_of("last.pt", 5) == 5


def test_pattern_and_jsonl_sources(tmp_path: Path) -> None:
    notes: list[str] = []
    pat = LinePattern(r"step (?P<step>\S+) loss (?P<loss>\S+)(?: acc (?P<acc>\S+))?", notes.append)
    assert pat.match("step 3 loss 0.5\n") == (3, {"loss": 0.5})
    assert pat.match("step 4 loss 0.25 acc 0.9") == (4, {"loss": 0.25, "acc": 0.9})
    assert pat.match("step x loss 1") is None and "step 'x' is not an int" in notes[-1]
    assert pat.match("step 5 loss nope") is None and "loss='nope' is not a number" in notes[-1]
    assert pat.match("unrelated") is None
    path = tmp_path / "m.jsonl"
    tail = JsonlTail(path, notes.append)
    assert tail.read() == []  # not written yet
    path.write_text('{"step": 1, "loss": 2}\nnot json\n{"step": "2", "loss": 1}\n{"step": 3, ')
    assert tail.read() == [(1, {"loss": 2.0})]
    assert "not JSON" in notes[-2] and "'step' must be an int >= 0, got '2'" in notes[-1]
    with open(path, "a") as f:
        f.write('"loss": 0.5, "tag": "x", "ok": true}\n')
    assert tail.read() == [(3, {"loss": 0.5})]
    assert "tag='x' is not a number" in notes[-2] and "ok=True" in notes[-1]
