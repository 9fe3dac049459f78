"""The model registry on the real dev Slurm cluster.

* A one-trial digits run of its own (keep policy: the newest checkpoint only): its
  first checkpoint is registered while the trial runs; the ticks' keep policy and
  `dlhpc gc` delete the later early ones but spare it (`dlhpc checkpoints` says
  "model NAME:1"); exported, its weights load with torch into the example's model.
* The session's finished lab (`finished_lab`): register the grid's best trial, list,
  show (the record: code, data, environment), export and load the weights; bad input
  (unknown trial, checkpoint, version; a deleted checkpoint; a non-empty folder)
  exits 2 and changes nothing.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from dlhpc.states import TERMINAL_EXPERIMENT_STATES as TERMINAL
from tests.integration._lab import FinishedLab
from tests.integration._reference import DIGITS
from tests.integration.conftest import Cli

pytestmark = pytest.mark.cluster

EXPERIMENT = """\
name: registry-gc
entrypoint: python train.py
resources: {cpus_per_task: 1, mem: 1G, time: '00:10:00'}
hyperparameters: {lr: 0.05, hidden: 32, dropout: 0.1, batch_size: 64, step_sleep: 0.1}
searcher: {name: single, metric: val_accuracy, smaller_is_better: false, max_length: 4}
checkpoint: {keep_best: 0, keep_latest: 1}
data: [{path: labels.csv, hash: true}]
"""


def _checkpoints(cli: Cli, exp_id: int) -> list[dict[str, Any]]:
    return cli.json("checkpoints", str(exp_id), "--all")["checkpoints"]  # type: ignore[no-any-return]


def _load_weights(folder: Path, hidden: int) -> None:
    """The exported ``checkpoint/state.pt`` (the digits example's TrainState save)
    loads into the example's model."""
    payload = torch.load(folder / "checkpoint" / "state.pt", map_location="cpu", weights_only=False)
    weights = payload["state_dicts"]["model"]
    model = torch.nn.Sequential(
        torch.nn.Linear(64, hidden),
        torch.nn.ReLU(),
        torch.nn.Dropout(0.1),
        torch.nn.Linear(hidden, 10),
    )
    model.load_state_dict(weights)
    assert model(torch.zeros(1, 64)).shape == (1, 10)


def test_gc_spares_a_registered_early_checkpoint(slurm_env: dict[str, str], tmp_path: Path) -> None:
    cli = Cli(slurm_env, tmp_path / "home")
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(DIGITS / "train.py", work / "train.py")
    (work / "labels.csv").write_text("0,1,2\n")
    (work / "exp.yaml").write_text(EXPERIMENT)
    exp_id = int(cli.json("launch", str(work / "exp.yaml"))["experiment_id"])
    exp = cli.tick_until(
        exp_id,
        lambda e: (
            any(c["state"] == "ACTIVE" for c in _checkpoints(cli, exp_id)) or e["state"] in TERMINAL
        ),
        240,
    )
    assert exp["state"] == "ACTIVE", "the trial ended before a tick saw its first checkpoint"
    first = min(
        (c for c in _checkpoints(cli, exp_id) if c["state"] == "ACTIVE"), key=lambda c: c["step"]
    )
    trial_id = first["trial_id"]
    out = cli(
        "model",
        "register",
        str(trial_id),
        "registry-gc",
        "--checkpoint",
        str(first["id"]),
        "--note",
        "epoch 1",
    )
    assert f"registered model registry-gc:1: trial {trial_id}" in out.stdout, out.stdout

    exp = cli.tick_until(exp_id, lambda e: e["state"] in TERMINAL, 240)
    assert exp["state"] == "COMPLETED", json.dumps(exp, indent=1)
    gc = cli.json("gc", str(exp_id))
    assert gc["experiments"][0]["errors"] == []
    rows = {c["id"]: c for c in _checkpoints(cli, exp_id)}
    final = max(c["step"] for c in rows.values())
    assert first["step"] < final  # an early one: the policy keeps only the newest
    assert rows[first["id"]]["state"] == "ACTIVE" and Path(first["path"]).is_dir()
    assert rows[first["id"]]["kept_because"] == ["model registry-gc:1"]
    deleted = [c for c in rows.values() if c["state"] == "DELETED"]
    assert deleted and not any(Path(c["path"]).exists() for c in deleted)
    assert all(c["step"] not in (first["step"], final) for c in deleted)

    show = cli.json("model", "show", "registry-gc")
    assert (show["version"], show["step"], show["note"]) == (1, first["step"], "epoch 1")
    assert show["record"]["data"][0]["path"].endswith("labels.csv")
    assert show["record"]["data"][0]["content_sha256"]
    assert show["record"]["environment"]["scheduler_version"]
    dest = tmp_path / "export"
    cli("model", "export", "registry-gc:1", str(dest))
    assert json.loads((dest / "model.json").read_text())["checkpoint_id"] == first["id"]
    _load_weights(dest, hidden=32)


def test_register_list_show_export_and_bad_input_on_the_lab(
    finished_lab: FinishedLab, tmp_path: Path
) -> None:
    cli, exp_id = finished_lab.cli, finished_lab.grid_id
    exp = cli.experiment(exp_id)
    best = max(
        exp["trials"], key=lambda t: t["best_metric"] if t["best_metric"] is not None else -1
    )
    out = cli("model", "register", str(best["id"]), "lab-digits", "--note", "grid's best")
    assert "registry" not in out.stderr and "(best by val_accuracy)" in out.stdout, out.stdout
    listed = [m for m in cli.json("model", "list")["models"] if m["name"] == "lab-digits"]
    assert [(m["version"], m["trial_id"], m["experiment_id"]) for m in listed] == [
        (1, best["id"], exp_id)
    ]
    show = cli.json("model", "show", "lab-digits:1")
    assert show["metric_name"] == "val_accuracy" and show["checkpoint_state"] == "ACTIVE"
    assert show["record"]["recorded"] == {"experiment": True, "attempt": True}
    assert show["record"]["code"]["kind"] in ("git", "snapshot")
    assert show["record"]["environment"]["nodes"]
    assert show["hparams"] == best["hparams"]

    dest = tmp_path / "lab-digits-1"
    cli("model", "export", "lab-digits:1", str(dest))
    assert {"checkpoint", "model.json", "README.txt", "metrics.csv", "repro.json"} <= {
        p.name for p in dest.iterdir()
    }
    _load_weights(dest, hidden=int(best["hparams"]["hidden"]))
    assert "val_accuracy" in (dest / "metrics.csv").read_text()

    # bad input: exit 2, a clear message, nothing changed
    ckpts = _checkpoints(cli, exp_id)
    gone = next(c for c in ckpts if c["state"] == "DELETED")
    other = next(c for c in ckpts if c["state"] == "ACTIVE" and c["trial_id"] != best["id"])
    before = cli.json("model", "list")
    cases = [
        (("register", "999999", "lab-digits"), "no trial 999999"),
        (
            ("register", str(best["id"]), "lab-digits", "--checkpoint", "999999"),
            "no checkpoint 999999",
        ),
        (
            ("register", str(gone["trial_id"]), "lab-digits", "--checkpoint", str(gone["id"])),
            "was deleted",
        ),
        (
            ("register", str(best["id"]), "lab-digits", "--checkpoint", str(other["id"])),
            "not trial",
        ),
        (("register", str(best["id"]), "bad/name"), "bad model name"),
        (("show", "lab-digits:9"), "no version 9 of model 'lab-digits'"),
        (("export", "lab-digits:9", str(tmp_path / "x")), "no version 9"),
        (("export", "lab-digits:1", str(dest)), "is not empty"),
    ]
    for args, msg in cases:
        proc = cli("model", *args, check=False)
        assert proc.returncode == 2 and msg in proc.stderr + proc.stdout, (args, proc)
    assert cli.json("model", "list") == before
    assert not (tmp_path / "x").exists()
