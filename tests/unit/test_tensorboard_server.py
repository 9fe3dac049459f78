"""The exported files in a real TensorBoard server, with its default loader (the
``tensorboard-data-server`` binary, ``--load_fast=true``): its scalars tab shows every
point of every trial and its HParams tab lists the trials with their hyperparameters
and metric. The Python reader of the other tests accepts formats this server ignores
(a DT_DOUBLE scalar), so this is the check that a user sees the points."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dlhpc.report.tensorboard import export_tensorboard
from dlhpc.store import Store
from tests.unit._tb import LOSS, add_points, db_points, make_experiment

_SESSION_GROUPS = {
    "experimentName": "",
    "allowedStatuses": ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"],
    "colParams": [{"metric": {"tag": "val_loss", "group": ""}, "order": "ORDER_ASC"}],
    "startIndex": 0,
    "sliceSize": 10,
}


def _get(url: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[Store, int, list[int], str]]:
    """Two trials exported, and TensorBoard serving the experiment's logdir."""
    store = Store(tmp_path / "home")
    exp_id, trials = make_experiment(
        store, [{"lr": 0.1, "opt": "adam"}, {"lr": 0.01, "opt": "sgd"}]
    )
    add_points(store, trials[0], "val_loss", LOSS)
    add_points(store, trials[1], "val_loss", [(1, 0.7, 1_700_000_000.0), (2, 0.6, 1.7e9 + 1)])
    logdir = export_tensorboard(store, exp_id).logdir
    log = tmp_path / "tensorboard.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--port", "0",
             "--load_fast", "true", "--reload_interval", "1"],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (found := re.search(r"at http://localhost:(\d+)/", log.read_text())):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        yield store, exp_id, trials, f"http://localhost:{found.group(1)}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_data_server_shows_every_point_and_the_hparams_tab_every_trial(
    server: tuple[Store, int, list[int], str],
) -> None:
    store, _, trials, url = server
    runs = {f"trial-{t:06d}": t for t in trials}
    deadline = time.monotonic() + 60
    while set(_get(f"{url}/data/plugin/scalars/tags")) != set(runs):  # loading
        assert time.monotonic() < deadline
        time.sleep(0.5)
    for run, trial_id in runs.items():
        got = _get(f"{url}/data/plugin/scalars/scalars?run={run}&tag=val_loss")
        points = [(step, None if value == "NaN" else value, wall) for wall, step, value in got]
        assert points == db_points(store, trial_id)["val_loss"]
    groups = _get(f"{url}/data/plugin/hparams/session_groups", _SESSION_GROUPS)["sessionGroups"]
    listed = {g["name"]: (g["hparams"], [m["value"] for m in g["metricValues"]]) for g in groups}
    assert listed == {
        f"trial-{trials[0]:06d}": ({"lr": 0.1, "opt": "adam"}, [pytest.approx(1 / 3, rel=1e-7)]),
        f"trial-{trials[1]:06d}": ({"lr": 0.01, "opt": "sgd"}, [pytest.approx(0.6, rel=1e-7)]),
    }
