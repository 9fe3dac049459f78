"""``dlhpc reproduce --from-checkpoint`` finds the original trial's checkpoint from
trusted roots (the configured ``checkpoint.dir`` and the recorded folder names), never
through a folder its job replaced with a symlink. One short trial on the local
backend; its checkpoints are published by hand into its folder, as its job would."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from dlhpc.protocol.checkpoint import publish_checkpoint
from tests.unit.test_reproduce_local import _db, _json, _run, _tick_until_over, workdir  # noqa: F401


def _payload(data: bytes) -> object:
    return lambda f: (f / "w.bin").write_bytes(data)


def test_from_checkpoint_never_follows_a_job_written_symlink(
    workdir: Path,  # noqa: F811
    home: Path,
    tmp_path: Path,
) -> None:
    (workdir / "train.py").write_text(
        "import dlhpc\nctx = dlhpc.init()\nctx.report(1, {'loss': 1.0})\nctx.close()\n"
    )
    (workdir / "exp.yaml").write_text(
        "name: repro-ckpt\nentrypoint: python train.py\n"
        "searcher: {name: single, metric: loss, max_length: 1}\n"
    )
    exp_id = _json("launch", str(workdir / "exp.yaml"))["experiment_id"]
    (trial,) = _tick_until_over(exp_id, timeout=120)["trials"]
    ((run_dir,),) = _db(home, "SELECT run_dir FROM trials WHERE id = ?", trial["id"])
    mine = Path(json.loads((Path(run_dir) / "trial.json").read_text())["checkpoint_dir"])
    own = publish_checkpoint(mine, 1, _payload(b"mine")).path  # type: ignore[arg-type]

    plan = _json("reproduce", str(trial["id"]), "--from-checkpoint", "--dry-run")
    assert plan["checkpoint"] == str(own)

    # the job swaps its own checkpoint folder for a link to someone else's checkpoints
    elsewhere = tmp_path / "someone-else"
    publish_checkpoint(elsewhere, 9, _payload(b"theirs"))  # type: ignore[arg-type]
    shutil.rmtree(mine)
    os.symlink(elsewhere, mine)
    res = _run("reproduce", str(trial["id"]), "--from-checkpoint", "--dry-run")
    assert res.exit_code == 2, res.output
    assert "symlink" in res.output and "ckpt-0000000009" not in res.output
    res = _run("reproduce", str(trial["id"]), "--from-checkpoint")
    assert res.exit_code == 2, res.output
    assert _db(home, "SELECT COUNT(*) FROM experiments")[0][0] == 1  # nothing launched

    # the trial's folder back, but the experiment's folder above it behind a link
    os.unlink(mine)
    publish_checkpoint(mine, 1, _payload(b"mine"))  # type: ignore[arg-type]
    moved = tmp_path / "moved"
    shutil.move(mine.parent, moved)
    os.symlink(moved, mine.parent)
    res = _run("reproduce", str(trial["id"]), "--from-checkpoint", "--dry-run")
    assert res.exit_code == 2 and "symlink" in res.output, res.output
