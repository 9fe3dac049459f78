"""``dlhpc reproduce`` and ``dlhpc diff`` end to end on the local backend (no Slurm).

The digits example trains a grid of two deterministic trials; the second is
reproduced and must end with bitwise the same weights, seed and hyperparameters,
although the workdir's train.py was broken right after launch (trials run from the
launch-time snapshot). A crash-once script shows that a restarted attempt runs the
snapshot too, not the workdir as edited since.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from dlhpc.cli.main import cli

DIGITS = Path(__file__).resolve().parents[2] / "templates" / "examples" / "digits"


def _run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def _json(*args: str) -> Any:
    res = _run(*args, "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def _tick_until_over(exp_id: int, timeout: float = 300) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        assert _run("tick", "-q").exit_code == 0
        exp = _json("status", str(exp_id))["experiments"][0]
        if exp["state"] != "ACTIVE":
            return exp  # type: ignore[no-any-return]
        assert time.monotonic() < deadline, exp
        time.sleep(0.5)


def _db(home: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    con = sqlite3.connect(home / "dlhpc.db")
    try:
        return con.execute(sql, args).fetchall()
    finally:
        con.close()


def _final_sha(home: Path, exp_id: int, trial_id: int) -> str:
    ((run_dir,),) = _db(home, "SELECT run_dir FROM trials WHERE id = ?", trial_id)
    spec = Path(run_dir) / "trial.json"
    ckpt = Path(json.loads(spec.read_text())["checkpoint_dir"])
    return (ckpt / "final_weights.sha256").read_text().strip()


@pytest.fixture
def workdir(tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DLHPC_SITE", "local")
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    d = tmp_path / "work"
    d.mkdir()
    return d


def test_reproduce_is_bitwise_identical_and_runs_the_launch_snapshot(
    workdir: Path, home: Path
) -> None:
    missing = [m for m in ("torch", "sklearn") if importlib.util.find_spec(m) is None]
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"needs {missing}")
        pytest.skip(f"needs {missing}")
    shutil.copy(DIGITS / "train.py", workdir / "train.py")
    (workdir / "labels.csv").write_text("0,1,2\n")  # a declared data input
    (workdir / "exp.yaml").write_text(
        "name: digits-repro\nentrypoint: python train.py\n"
        "hyperparameters:\n"
        "  lr: {type: log, minval: -2, maxval: -1, count: 2}\n"
        "  hidden: 32\n  dropout: 0.2\n  batch_size: 64\n"
        "searcher: {name: grid, metric: val_accuracy, smaller_is_better: false, max_length: 3}\n"
        "reproducibility: {seed: 7, deterministic: true}\n"
        "data: [{path: labels.csv, hash: true}]\n"
    )
    exp_id = _json("launch", str(workdir / "exp.yaml"))["experiment_id"]
    # the classic silent change: the workdir is edited while (or before) the trials run
    (workdir / "train.py").write_text("raise SystemExit(9)\n")
    exp = _tick_until_over(exp_id)
    assert exp["state"] == "COMPLETED", exp
    first, second = sorted(exp["trials"], key=lambda t: t["id"])

    # the record: in the DB, for the experiment and each attempt
    (repro_json,) = _db(home, "SELECT repro_json FROM experiments WHERE id = ?", exp_id)[0]
    record = json.loads(repro_json)
    assert record["code"]["kind"] == "snapshot" and "train.py" in record["code"]["manifest"]
    assert record["packages"]["items"] and record["python"]["version"]
    (env_json,) = _db(home, "SELECT env_json FROM attempts WHERE trial_id = ?", second["id"])[0]
    env = json.loads(env_json)
    assert env["env"]["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8" and env["cpu"]["model"]
    assert env["data"][0]["path"] == str(workdir / "labels.csv")
    assert env["data"][0]["content_sha256"]

    # reproduce the second trial (its seed is not the one a new grid's first trial gets)
    dry = _run("reproduce", str(second["id"]), "--dry-run")
    assert dry.exit_code == 0 and "would launch" in dry.output, dry.output
    out = _json("reproduce", str(second["id"]))
    new_exp, new_trial = out["experiment_id"], out["trial_id"]
    assert new_exp == exp_id + 1 and out["reproduces"]["trial_id"] == second["id"]
    sections = {d["section"] for d in out["differences"]}
    assert not sections & {"packages", "python", "modules", "data", "gpu", "cpu"}, out
    rexp = _tick_until_over(new_exp)
    assert rexp["state"] == "COMPLETED", rexp
    (rtrial,) = rexp["trials"]
    assert rtrial["hparams"] == second["hparams"]
    seeds = dict(_db(home, "SELECT id, seed FROM trials"))
    assert seeds[new_trial] == seeds[second["id"]] != seeds[first["id"]]
    sha = _final_sha(home, exp_id, second["id"])
    assert _final_sha(home, new_exp, new_trial) == sha  # bitwise the same weights
    assert _final_sha(home, exp_id, first["id"]) != sha

    # dlhpc diff: the reproduction matches its original; the two grid trials do not
    same = _json("diff", str(second["id"]), str(new_trial))["differences"]
    assert not {d["section"] for d in same} & {"code", "config", "hparams", "seed", "data"}, same
    other = {
        (d["section"], d["item"])
        for d in _json("diff", str(first["id"]), str(second["id"]))["differences"]
    }
    assert ("hparams", "lr") in other and ("seed", "seed") in other
    text = _run("diff", str(first["id"]), str(second["id"])).output
    assert "hparams" in text and "difference(s)" in text

    # --from-checkpoint: a copy of the newest checkpoint, from which it resumes (done)
    out = _json("reproduce", str(second["id"]), "--from-checkpoint")
    cexp = _tick_until_over(out["experiment_id"])
    assert cexp["state"] == "COMPLETED", cexp
    assert _final_sha(home, out["experiment_id"], out["trial_id"]) == sha
    assert out["checkpoint"] and Path(out["checkpoint"]).name.startswith("ckpt-")
    assert _run("reproduce", "999").exit_code == 2


def test_a_restarted_attempt_runs_the_snapshot_not_the_edited_workdir(
    workdir: Path, home: Path
) -> None:
    (workdir / "train.py").write_text(
        "import sys\nfrom pathlib import Path\nimport dlhpc\n"
        "ctx = dlhpc.init()\n"
        "marker = Path(ctx.checkpoint_dir) / 'crashed-once'\n"
        "if not marker.exists():\n"
        "    marker.parent.mkdir(parents=True, exist_ok=True)\n"
        "    marker.write_text('x')\n"
        "    sys.exit(3)\n"
        "ctx.report(1, {'version': 1.0})\n"
        "ctx.close()\n"
    )
    (workdir / "exp.yaml").write_text(
        "name: silent-change\nentrypoint: python train.py\nmax_restarts: 2\n"
        "searcher: {name: single, metric: version, smaller_is_better: false, max_length: 1}\n"
    )
    exp_id = _json("launch", str(workdir / "exp.yaml"))["experiment_id"]
    # edited after launch: the restart (submitted by a later tick) must not see this
    (workdir / "train.py").write_text(
        "import dlhpc\nctx = dlhpc.init()\nctx.report(1, {'version': 2.0})\nctx.close()\n"
    )
    exp = _tick_until_over(exp_id)
    (trial,) = exp["trials"]
    assert exp["state"] == "COMPLETED" and trial["restarts"] == 1, trial
    assert trial["best_metric"] == 1.0  # the launch-time code ran, both times
