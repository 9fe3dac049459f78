"""Run and checkpoint folders carry the experiment's slug, and experiments
launched before that (``exp-000007``) keep being found where they are."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dlhpc.config import load_experiment, name_slug
from dlhpc.config.serde import to_jsonable
from dlhpc.orchestrator.checkpoints import checkpoint_root
from dlhpc.orchestrator.launch import launch
from dlhpc.orchestrator.pool import SchedulerPool
from dlhpc.orchestrator.submit import submit_pending
from dlhpc.protocol import TrialSpec, experiment_dir_name, recorded_slug
from dlhpc.protocol.layout import FOLDER_SLUG_MAX
from dlhpc.report._status_sql import disk_usage
from dlhpc.scheduler.plugins import Backend, BackendTable
from dlhpc.search import SearcherTable
from dlhpc.store import Experiment, Store
from tests.unit._db import add_experiment, add_trial
from tests.unit.test_site_limits import Limited

HOSTILE = {
    "../x": "x-",
    "Über Modell — 名前 v2": "uber-modell-v2-",
    "my run  with spaces": "my-run-with-spaces-",
    "a" * 128: "a" * 40,
    "/etc/passwd": "etc-passwd-",
    "名前": "",  # nothing readable: the hash alone
}
FOLDER = re.compile(r"exp-000007-[a-z0-9][a-z0-9-]*[a-z0-9]")


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_name_gives_a_safe_bounded_folder_name(name: str) -> None:
    folder = experiment_dir_name(7, name_slug(name))
    assert FOLDER.fullmatch(folder), folder
    assert len(folder) <= len("exp-000007-") + FOLDER_SLUG_MAX
    assert folder.removeprefix("exp-000007-").startswith(HOSTILE[name])
    assert "/" not in folder and ".." not in folder and " " not in folder
    # the recorded folder gives its slug back, and the same name again
    assert experiment_dir_name(7, recorded_slug(7, f"/runs/{folder}")) == folder


def test_the_folder_rule_edges() -> None:
    assert experiment_dir_name(7) == experiment_dir_name(7, "") == "exp-000007"
    # cut at 40, never ending in "-"
    assert experiment_dir_name(7, "a" * 39 + "-b") == "exp-000007-" + "a" * 39
    for bad in ("../x", "A", "-a", "a/b", "a b"):
        with pytest.raises(ValueError, match="unsafe folder slug"):
            experiment_dir_name(7, bad)
    # what is recorded in the database reaches a path only when the rule made it
    assert recorded_slug(7, "/runs/exp-000007") == ""  # launched before slugs
    assert recorded_slug(7, "/runs/exp-000007-my-run") == "my-run"
    for other in ("", "/runs/exp-000008-my-run", "/runs/exp-000007-..", "/x/exp-000007-A"):
        assert recorded_slug(7, other) == "", other
    assert recorded_slug(7, "/runs/exp-000007-" + "a" * 41) == ""


YAML = """\
name: Mein Modell v2
entrypoint: python train.py
resources: {cpus_per_task: 1, mem: "1G", time: "03:00:00"}
searcher: {name: single, metric: loss, max_length: 1}
checkpoint: {dir: CKPT}
"""


def _setup(tmp_path: Path) -> tuple[Path, SchedulerPool, Limited]:
    yaml = tmp_path / "exp.yaml"
    yaml.write_text(YAML.replace("CKPT", str(tmp_path / "ck")))
    (tmp_path / "train.py").write_text("")
    backend = Limited()
    pool = SchedulerPool(
        local_root=tmp_path / "local",
        backends=BackendTable([Backend("local", lambda _r: backend)]),
    )
    return yaml, pool, backend


def test_a_new_experiment_names_its_run_and_checkpoint_folders_with_its_slug(
    tmp_path: Path,
) -> None:
    yaml, pool, backend = _setup(tmp_path)
    cfg = load_experiment(yaml, site="local", searchers=SearcherTable())
    store = Store(tmp_path / "home")
    exp_id = launch(cfg, store, pool, record={}).experiment_id
    name = f"exp-{exp_id:06d}-{cfg.slug}"
    (tdir,) = backend.submitted[0]
    assert tdir == store.runs_root / name / "trials" / "trial-000001"
    spec = TrialSpec.read(tdir / "trial.json")
    assert spec.experiment_dir == str(store.runs_root / name)
    assert spec.checkpoint_dir == str(tmp_path / "ck" / name / "trial-000001")
    assert (store.runs_root / name / "entry.sh").is_file()
    with store.read() as s:
        exp = s.get(Experiment, exp_id)
        assert exp is not None and exp.run_dir == str(store.runs_root / name)
        assert checkpoint_root(exp) == tmp_path / "ck" / name


def test_an_experiment_launched_before_slugs_keeps_its_folders(tmp_path: Path) -> None:
    yaml, pool, backend = _setup(tmp_path)
    cfg = load_experiment(yaml, site="local", searchers=SearcherTable())
    store = Store(tmp_path / "home")
    old = store.runs_root / "exp-000001"  # as the earlier code recorded it
    with store.write() as s:
        exp = add_experiment(s, old, config_json=json.dumps(to_jsonable(cfg)), name=cfg.name)
        t = add_trial(s, exp, request_id=0, state="PENDING")
        t.run_dir = str(old / "trials" / f"trial-{t.id:06d}")
        exp_id, tid = exp.id, t.id
    assert len(submit_pending(store, pool, exp_id)) == 1  # resubmitted by the new code
    (tdir,) = backend.submitted[0]
    assert tdir == old / "trials" / f"trial-{tid:06d}"
    spec = TrialSpec.read(tdir / "trial.json")
    assert spec.experiment_dir == str(old)
    assert spec.checkpoint_dir == str(tmp_path / "ck" / "exp-000001" / f"trial-{tid:06d}")
    assert sorted(p.name for p in store.runs_root.iterdir()) == ["exp-000001"]
    with store.read() as s:
        row = s.get(Experiment, exp_id)
        assert row is not None
        assert checkpoint_root(row) == tmp_path / "ck" / "exp-000001"  # gc, export
        assert disk_usage(s, [row])[exp_id].checkpoint_root == str(tmp_path / "ck" / "exp-000001")
