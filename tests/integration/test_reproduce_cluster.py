"""``dlhpc reproduce`` on the real dev Slurm cluster: bitwise the same weights.

A grid of two deterministic digits trials runs from a workdir that is broken right
after launch (the jobs run the launch-time snapshot); the second trial is reproduced
and must end with the same final weights (sha256), seed and hyperparameters, and
``dlhpc diff`` finds no difference in code, config, hyperparameters, seed or data.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from dlhpc.states import TERMINAL_EXPERIMENT_STATES as TERMINAL
from tests.integration._reference import DIGITS
from tests.integration.conftest import Cli

pytestmark = pytest.mark.cluster


def _final_sha(cli: Cli, exp_id: int, trial_id: int) -> str:
    run = Path(cli.experiment(exp_id)["run_dir"]) / "trials" / f"trial-{trial_id:06d}"
    ckpt = Path(json.loads((run / "trial.json").read_text())["checkpoint_dir"])
    return (ckpt / "final_weights.sha256").read_text().strip()


@pytest.mark.smoke
def test_reproduced_trial_is_bitwise_identical_on_slurm(cli: Cli, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(DIGITS / "train.py", work / "train.py")
    (work / "labels.csv").write_text("0,1,2\n")
    exp_yaml = work / "exp.yaml"
    exp_yaml.write_text(
        "name: repro-cluster\nentrypoint: python train.py\n"
        "resources: {cpus_per_task: 1, mem: 1G, time: '00:10:00'}\n"
        "hyperparameters:\n"
        "  lr: {type: log, minval: -2, maxval: -1, count: 2}\n"
        "  hidden: 32\n  dropout: 0.2\n  batch_size: 64\n"
        "searcher: {name: grid, metric: val_accuracy, smaller_is_better: false, max_length: 3}\n"
        "reproducibility: {seed: 11, deterministic: true}\n"
        "data: [{path: labels.csv, hash: true}]\n"
    )
    exp_id = cli.json("launch", str(exp_yaml))["experiment_id"]
    (work / "train.py").write_text("raise SystemExit(9)\n")  # edited after launch
    exp = cli.tick_until(exp_id, lambda e: e["state"] in TERMINAL, timeout=240)
    assert exp["state"] == "COMPLETED", json.dumps(exp, indent=1)
    first, second = sorted(exp["trials"], key=lambda t: t["id"])

    out = cli.json("reproduce", str(second["id"]))
    new_exp, new_trial = out["experiment_id"], out["trial_id"]
    assert out["reproduces"] == {"trial_id": second["id"], "experiment_id": exp_id}
    assert not {d["section"] for d in out["differences"]} & {"packages", "python", "data"}
    rexp = cli.tick_until(new_exp, lambda e: e["state"] in TERMINAL, timeout=240)
    assert rexp["state"] == "COMPLETED", json.dumps(rexp, indent=1)
    assert rexp["trials"][0]["hparams"] == second["hparams"]

    con = sqlite3.connect(cli.home / "dlhpc.db")
    try:
        seeds = dict(con.execute("SELECT id, seed FROM trials").fetchall())
        (repro_json,) = con.execute(
            "SELECT repro_json FROM experiments WHERE id = ?", (exp_id,)
        ).fetchone()
        (env_json,) = con.execute(
            "SELECT env_json FROM attempts WHERE trial_id = ? ORDER BY id DESC", (new_trial,)
        ).fetchone()
    finally:
        con.close()
    assert seeds[new_trial] == seeds[second["id"]] != seeds[first["id"]]
    sha = _final_sha(cli, exp_id, second["id"])
    assert _final_sha(cli, new_exp, new_trial) == sha, "the reproduction's weights differ"
    assert _final_sha(cli, exp_id, first["id"]) != sha

    record, env = json.loads(repro_json), json.loads(env_json)
    assert record["slurm"]["version"].startswith("slurm") and record["site"]["backend"] == "slurm"
    assert env["env"]["SLURM_JOB_ID"] and env["nodes"] and env["data"][0]["content_sha256"]
    same = cli.json("diff", str(second["id"]), str(new_trial))["differences"]
    assert not {d["section"] for d in same} & {"code", "config", "hparams", "seed", "data"}, same
