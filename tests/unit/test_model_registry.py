"""The model registry: `dlhpc model register|list|show|export`, the GC rule that spares
registered checkpoints, and the models index page (its HTML; Chromium: test_models_browser)."""

from __future__ import annotations

import csv
import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import select

from dlhpc.cli.main import cli
from dlhpc.orchestrator.checkpoints import CkptInfo, GcPolicy, gc, plan_gc
from dlhpc.orchestrator.model_registry import record_summary, register
from dlhpc.protocol.checkpoint import publish_checkpoint
from dlhpc.report.models_index import MODELS_FILE, write_models_index
from dlhpc.store import Attempt, Checkpoint, Metric, ModelVersion, Store, utcnow
from dlhpc.store.model_registry import parse_ref
from tests.unit._db import add_experiment, add_trial

LAUNCH_RECORD = {
    "code": {"kind": "git", "commit": "0123abc", "branch": "main", "dirty": True},
    "python": {"version": "3.11.2"},
    "packages": {"items": {"torch": "2.3.0", "numpy": "1.26.4"}},
    "slurm": {"version": "22.05.8"},
    "site": {"name": "dev"},
}
ATTEMPT_RECORD = {
    "nodes": "n1",
    "cpu": {"model": "Xeon"},
    "gpu": {"driver": "550.54", "devices": [{"index": 0, "name": "H100"}]},
    "data": [
        {
            "path": "/data/digits",
            "exists": True,
            "files": 3,
            "bytes": 42,
            "listing_sha256": "ab" * 32,
        }
    ],
}


def _run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def _folder(root: Path, exp_id: int, trial_id: int, step: int, size: int) -> Path:
    tdir = root / f"exp-{exp_id:06d}" / f"trial-{trial_id:06d}"
    return publish_checkpoint(tdir, step, lambda f: (f / "w.bin").write_bytes(b"\1" * size)).path


def _ckpt(s: Any, trial_id: int, path: Path, step: int, metric: float | None) -> int:
    """A checkpoint row for the folder ``path``, with the size its job would record
    (its payload's bytes; 100 for a folder that does not exist)."""
    payload = [f for f in path.rglob("*") if f.is_file() and f.name != "MANIFEST.json"]
    c = Checkpoint(
        trial_id=trial_id,
        step=step,
        path=str(path),
        size_bytes=sum(f.stat().st_size for f in payload) if path.exists() else 100,
        metric=metric,
        created_at=utcnow(),
    )
    s.add(c)
    s.flush()
    return c.id


def _world(store: Store, root: Path, keep: tuple[int, int, int] = (0, 1, 1)) -> dict[str, Any]:
    """Experiment: metric acc (larger is better). Trial t: steps 1-4 with acc .2 .9 .5 .3
    (policy keep_best 1 + keep_latest 1 keeps steps 2 and 4). Trial u: one checkpoint,
    and a DELETED one. Attempt records and metric rows for t."""
    ck = dict(zip(("keep_experiment_best", "keep_best", "keep_latest"), keep, strict=True))
    config = {"name": "digits", "checkpoint": {"dir": str(root), **ck}}
    ids: dict[str, Any] = {"root": root}
    with store.write() as s:
        exp = add_experiment(
            s,
            root.parent / "runs",
            name="digits",
            metric="acc",
            smaller_is_better=False,
            state="COMPLETED",
            config_json=json.dumps(config),
            yaml_text="name: digits\n",
            repro_json=json.dumps(LAUNCH_RECORD),
        )
        t = add_trial(s, exp, state="COMPLETED", hparams_json='{"lr": 0.1}', seed=7, max_length=4)
        u = add_trial(s, exp, state="COMPLETED", request_id=1)
        for step, acc in zip((1, 2, 3, 4), (0.2, 0.9, 0.5, 0.3), strict=True):
            ids[step] = _ckpt(s, t.id, _folder(root, exp.id, t.id, step, 10 * step), step, acc)
        ids["u_ckpt"] = _ckpt(s, u.id, _folder(root, exp.id, u.id, 1, 5), 1, 0.1)
        gone = _ckpt(s, u.id, root / "gone" / "ckpt-0000000002", 2, 0.2)
        deleted = s.get(Checkpoint, gone)
        assert deleted is not None
        deleted.state, deleted.deleted_at = "DELETED", utcnow()
        a = Attempt(
            trial_id=t.id,
            attempt_key="9_0.r0",
            job_id="9_0",
            state="COMPLETED",
            created_at=utcnow(),
            env_json=json.dumps(ATTEMPT_RECORD),
        )
        s.add(a)
        s.flush()
        for step, acc in ((1, 0.2), (2, 0.9)):
            s.add(
                Metric(trial_id=t.id, attempt_id=a.id, step=step, name="acc", value=acc, time=1.0)
            )
        ids.update(exp=exp.id, t=t.id, u=u.id, gone=gone)
    return ids


@pytest.fixture
def world(tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    monkeypatch.setenv("DLHPC_SITE", "local")
    store = Store(home)
    ids = _world(store, tmp_path / "ckpt")
    store.close()
    yield ids


def _versions(home: Path) -> list[tuple[str, int, int]]:
    store = Store(home)
    try:
        with store.read() as s:
            rows = s.execute(
                select(ModelVersion.name, ModelVersion.version, ModelVersion.checkpoint_id)
            ).all()
        return sorted((str(a), int(b), int(c)) for a, b, c in rows)
    finally:
        store.close()


# -- the GC rule ---------------------------------------------------------------------------


@pytest.mark.parametrize("pinned", [False, True])
def test_plan_keeps_a_registered_checkpoint_whatever_the_policy(pinned: bool) -> None:
    cks = [CkptInfo(i, 1, i, metric=0.1 * i, pinned=pinned and i == 2) for i in (1, 2, 3)]
    none = GcPolicy(0, 0, 0)
    assert plan_gc(cks, (), none, False).delete == ([1, 3] if pinned else [1, 2, 3])
    plan = plan_gc(cks, (), none, False, {2: ["best:1", "best:3"], 99: ["gone:1"]})
    assert plan.delete == [1, 3]
    want = ("pinned",) if pinned else ()
    assert plan.keep == {2: (*want, "model best:1", "model best:3")}


@pytest.mark.parametrize("keep", [(0, 1, 1), (0, 0, 0), (1, 0, 1)])
def test_gc_spares_the_registered_checkpoint(
    tmp_path: Path, keep: tuple[int, int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Step 1 (acc .2: neither best nor latest) is registered: GC deletes step 3 (and
    whatever else the policy drops) but not step 1; `dlhpc checkpoints` says why."""
    home = tmp_path / "home"
    monkeypatch.setenv("DLHPC_HOME", str(home))
    monkeypatch.setenv("DLHPC_SITE", "local")
    store = Store(home)
    ids = _world(store, tmp_path / "ckpt", keep)
    r = register(store, ids["t"], "digits-cnn", ids[1])
    assert (r.version, r.chosen_as, r.step) == (1, "given", 1)
    report = gc(store, ids["exp"])
    with store.read() as s:
        states = {c.id: (c.state, Path(c.path).is_dir()) for c in s.scalars(select(Checkpoint))}
    store.close()
    assert states[ids[1]] == ("ACTIVE", True)
    assert states[ids[3]] == ("DELETED", False)
    assert report.errors == [] and len(report.deleted) >= 1
    res = _run("checkpoints", str(ids["exp"]), "--json")
    rows = {c["id"]: c for c in json.loads(res.output)["checkpoints"]}
    assert rows[ids[1]]["kept_because"] == ["model digits-cnn:1"]
    assert "model digits-cnn:1" in _run("checkpoints", str(ids["exp"])).output


# -- register, list, show ------------------------------------------------------------------


def test_register_picks_the_best_then_numbers_versions(world: dict[str, Any], home: Path) -> None:
    res = _run("model", "register", str(world["t"]), "digits-cnn", "--note", "first <b>try</b>")
    assert res.exit_code == 0, res.output
    assert "registered model digits-cnn:1" in res.output
    assert f"checkpoint {world[2]} at step 2 (best by acc)" in res.output
    res = _run("model", "register", str(world["t"]), "digits-cnn", "--checkpoint", str(world[4]))
    assert "digits-cnn:2" in res.output and "(given)" in res.output, res.output
    res = _run("model", "register", str(world["u"]), "other.v_1-x")
    assert "other.v_1-x:1" in res.output, res.output
    assert _versions(home) == [
        ("digits-cnn", 1, world[2]),
        ("digits-cnn", 2, world[4]),
        ("other.v_1-x", 1, world["u_ckpt"]),
    ]

    listed = json.loads(_run("model", "list", "--json").output)["models"]
    assert [(m["name"], m["version"], m["step"]) for m in listed] == [
        ("digits-cnn", 1, 2),
        ("digits-cnn", 2, 4),
        ("other.v_1-x", 1, 1),
    ]
    first = listed[0]
    assert (first["trial_id"], first["experiment_id"], first["metric"]) == (
        world["t"],
        world["exp"],
        0.9,
    )
    assert (
        first["note"] == "first <b>try</b>" and first["user"] and first["created_at"].endswith("Z")
    )
    table = _run("model", "list").output
    assert "digits-cnn:2" in table and "first <b>try</b>" in table  # as text, not markup

    latest = json.loads(_run("model", "show", "digits-cnn", "--json").output)
    assert (latest["version"], latest["checkpoint_id"]) == (2, world[4])
    one = json.loads(_run("model", "show", "digits-cnn:1", "--json").output)
    assert one["checkpoint_path"].endswith("ckpt-0000000002") and one["hparams"] == {"lr": 0.1}
    rec = one["record"]
    assert rec["code"]["commit"] == "0123abc" and rec["code"]["dirty"] is True
    assert rec["data"][0]["path"] == "/data/digits" and rec["data"][0]["files"] == 3
    env = rec["environment"]
    assert (env["python"], env["packages"], env["scheduler_version"]) == ("3.11.2", 2, "22.05.8")
    assert (env["gpus"], env["gpu_driver"], env["nodes"]) == (["H100"], "550.54", "n1")
    text = _run("model", "show", "digits-cnn:1").output
    for want in (
        "model digits-cnn:1",
        "git 0123abc (dirty)",
        "/data/digits: 3 file(s)",
        "GPUs H100",
    ):
        assert want in text, text


def test_a_trial_without_metrics_registers_its_latest(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DLHPC_SITE", "local")
    store = Store(home)
    root = tmp_path / "ckpt"
    with store.write() as s:
        exp = add_experiment(
            s, tmp_path / "runs", config_json=json.dumps({"checkpoint": {"dir": str(root)}})
        )
        t = add_trial(s, exp, state="COMPLETED")
        for step in (1, 2):
            _ckpt(s, t.id, _folder(root, exp.id, t.id, step, 3), step, None)
        tid = t.id
    r = register(store, tid, "m")
    store.close()
    assert (r.step, r.chosen_as) == (2, "latest (no checkpoint of the trial has a metric)")


def test_record_summary_of_missing_records() -> None:
    out = record_summary({}, {})
    assert out["recorded"] == {"experiment": False, "attempt": False}
    assert out["data"] == [] and out["environment"]["gpus"] == []


@pytest.mark.parametrize(
    ("ref", "want"),
    [("m", ("m", None)), ("m:3", ("m", 3)), ("a.b-c_d:12", ("a.b-c_d", 12))],
)
def test_parse_ref(ref: str, want: tuple[str, int | None]) -> None:
    assert parse_ref(ref) == want


# -- bad input -----------------------------------------------------------------------------


def test_bad_input_exits_2_and_changes_nothing(
    world: dict[str, Any], home: Path, tmp_path: Path
) -> None:
    assert _run("model", "register", str(world["t"]), "m").exit_code == 0
    trial_dir = Path(world["root"]) / f"exp-{world['exp']:06d}" / f"trial-{world['t']:06d}"
    shutil.rmtree(trial_dir / "ckpt-0000000004")  # its row stays ACTIVE: the folder is gone
    outside = _folder(tmp_path / "elsewhere", world["exp"], world["t"], 5, 3)
    store = Store(home)
    with store.write() as s:
        outside_id = _ckpt(s, world["t"], outside, 5, 0.1)
    store.close()
    before = _versions(home)
    files = {p: p.read_bytes() for p in world["root"].rglob("*") if p.is_file()}
    corrupt = Path(world["root"]) / f"exp-{world['exp']:06d}" / f"trial-{world['t']:06d}"
    corrupt /= "ckpt-0000000003"
    (corrupt / "w.bin").write_bytes(b"\2" * 30)  # same size, other bytes: sha256 differs
    files[corrupt / "w.bin"] = b"\2" * 30
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("x")
    cases = [
        (("register", "999", "m"), "no trial 999"),
        (("register", str(world["t"]), "m", "--checkpoint", "999"), "no checkpoint 999"),
        (("register", str(world["t"]), "m", "--checkpoint", str(world["u_ckpt"])), "not trial"),
        (("register", str(world["u"]), "m", "--checkpoint", str(world["gone"])), "was deleted"),
        (("register", str(world["t"]), "m", "--checkpoint", str(world[3])), "sha256 mismatch"),
        (("register", str(world["t"]), "m", "--checkpoint", str(world[4])), "is gone"),
        (("register", str(world["t"]), "m", "--checkpoint", str(outside_id)), "not inside"),
        (("register", str(world["t"]), "--", "-m"), "bad model name '-m'"),
        (("register", str(world["t"]), "a:b"), "bad model name"),
        (("register", str(world["t"]), "a b"), "bad model name"),
        (("register", str(world["t"]), "x" * 129), "bad model name"),
        (("register", str(world["t"]), "<script>"), "bad model name"),
        (("register", str(world["t"]), "m", "--note", "n" * 4001), "at most 4000"),
        (("show", "nope"), "no model 'nope'"),
        (("show", "m:7"), "no version 7 of model 'm' (versions: [1])"),
        (("show", "m:0"), "bad model version '0'"),
        (("show", "m:x"), "bad model version 'x'"),
        (("export", "m:7", str(tmp_path / "e1")), "no version 7"),
        (("export", "m:1", str(full)), "is not empty"),
    ]
    for args, msg in cases:
        res = _run("model", *args)
        assert res.exit_code == 2 and msg in res.output, (args, res.output)
    assert _versions(home) == before
    assert {p: p.read_bytes() for p in world["root"].rglob("*") if p.is_file()} == files
    assert not (tmp_path / "e1").exists() and [p.name for p in full.iterdir()] == ["x"]


# -- export --------------------------------------------------------------------------------


def test_export_writes_weights_config_metrics_record_and_readme(
    world: dict[str, Any], tmp_path: Path
) -> None:
    assert (
        _run("model", "register", str(world["t"]), "m", "--checkpoint", str(world[3])).exit_code
        == 0
    )
    out = tmp_path / "share" / "m1"
    res = _run("model", "export", "m:1", str(out))
    assert res.exit_code == 0, res.output
    assert f"exported model m:1 (trial {world['t']}, checkpoint {world[3]}, step 3)" in res.output
    assert sorted(p.name for p in out.iterdir()) == [
        "README.txt",
        "checkpoint",
        "config.yaml",
        "experiment.yaml",
        "hparams.json",
        "metrics.csv",
        "model.json",
        "repro.json",
    ]
    assert (out / "checkpoint" / "w.bin").read_bytes() == b"\1" * 30
    assert (out / "checkpoint" / "MANIFEST.json").is_file()
    model = json.loads((out / "model.json").read_text())
    assert (model["name"], model["version"], model["step"], model["metric"]) == ("m", 1, 3, 0.5)
    assert model["record"]["code"]["commit"] == "0123abc"
    repro = json.loads((out / "repro.json").read_text())
    assert repro["checkpoint"]["chosen_as"] == "given"
    assert repro["checkpoint"]["id"] == world[3] and repro["experiment"]["code"]["dirty"] is True
    with open(out / "metrics.csv", newline="") as f:
        assert list(csv.reader(f))[1:] == [["1", "acc", "0.2", "1.0"], ["2", "acc", "0.9", "1.0"]]
    readme = (out / "README.txt").read_text()
    assert "Model m:1" in readme and "checkpoint/" in readme and "acc = 0.5" in readme
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no temp left


def test_export_of_a_version_whose_checkpoint_is_gone(
    world: dict[str, Any], tmp_path: Path, home: Path
) -> None:
    """A version's checkpoint row DELETED (e.g. by hand, or a DB from before the rule):
    export refuses, exit 2, writes nothing."""
    assert (
        _run("model", "register", str(world["t"]), "m", "--checkpoint", str(world[1])).exit_code
        == 0
    )
    store = Store(home)
    with store.write() as s:
        row = s.get(Checkpoint, world[1])
        assert row is not None
        row.state = "DELETED"
    store.close()
    res = _run("model", "export", "m", str(tmp_path / "out"))
    assert res.exit_code == 2 and "was deleted" in res.output, res.output
    assert not (tmp_path / "out").exists()
    assert "(deleted)" in _run("model", "list").output


# -- the models index page -----------------------------------------------------------------

XSS_NAME = '"><img src=x onerror=alert(1)>'
XSS_NOTE = "<script>alert(2)</script> & </table>"


def test_models_index_lists_names_versions_and_links_escaped(
    world: dict[str, Any], home: Path, tmp_path: Path
) -> None:
    for args in (("m", "--note", XSS_NOTE), ("m",), ("zeta",)):
        assert _run("model", "register", str(world["t"]), *args).exit_code == 0
    store = Store(home)
    with store.write() as s:  # a name the CLI refuses, as another writer might have stored it
        s.add(
            ModelVersion(
                name=XSS_NAME,
                version=1,
                experiment_id=world["exp"],
                trial_id=world["t"],
                checkpoint_id=world[2],
                step=2,
                metric=0.9,
                note=XSS_NOTE,
                user="<u>",
                created_at=utcnow(),
            )
        )
    path = write_models_index(store, tmp_path / "site")
    store.close()
    assert path == tmp_path / "site" / MODELS_FILE
    html = path.read_text()
    assert "<script>alert" not in html and "<img src=x" not in html and "<u>" not in html
    assert "&lt;script&gt;alert(2)&lt;/script&gt; &amp; &lt;/table&gt;" in html
    assert html.count(f'href="exp-{world["exp"]:06d}.html"') == 4
    sections = re.findall(r"<h2>(.*?) <span", html)
    assert sections == ["&quot;&gt;&lt;img src=x onerror=alert(1)&gt;", "m", "zeta"]
    assert html.index('<tr id="m:2">') < html.index('<tr id="m:1">')  # newest first
    assert 'href="index.html"' in html


def test_models_index_without_models(tmp_path: Path) -> None:
    store = Store(tmp_path / "home")
    html = write_models_index(store, tmp_path / "out").read_text()
    store.close()
    assert "No registered models yet" in html


def test_register_takes_the_lease(world: dict[str, Any], home: Path) -> None:
    """While another reconciler holds the lease, register fails (exit 1: run it again)
    and writes nothing; afterwards it works."""
    other = Store(home)
    with other.hold_lease():
        res = _run("model", "register", str(world["t"]), "m")
        assert res.exit_code == 1 and "another reconciler" in res.output, res.output
        assert _versions(home) == []
    other.close()
    assert _run("model", "register", str(world["t"]), "m").exit_code == 0
    assert _versions(home) == [("m", 1, world[2])]
