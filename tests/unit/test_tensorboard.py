"""TensorBoard export: every metric point read back with TensorBoard's own reader.

The files are read with ``event_accumulator`` (every tensor kept) and, for what the
scalars tab and the HParams tab see, with TensorBoard's data provider over its event
multiplexer. Each test compares every point (step, value, wall time; NULL as NaN) with
the ``metrics`` table (values as float32: TensorBoard's scalar type; ``tests/unit/_tb.py``).
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import Any

import pytest

from dlhpc.errors import DlhpcError, NotFoundError, UnsafePathError, UsageError
from dlhpc.report import tensorboard as tb
from dlhpc.store import Store, Trial, utcnow
from tests.unit._tb import (
    LOSS,
    accumulator,
    add_points,
    assert_same_as_db,
    db_points,
    float32,
    make_experiment,
    read_points,
    trial_folder,
)

api_pb2 = pytest.importorskip("tensorboard.plugins.hparams.api_pb2")
metadata = pytest.importorskip("tensorboard.plugins.hparams.metadata")


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "home")


def test_every_point_is_read_back_as_in_the_database(store: Store) -> None:
    exp_id, (t1, t2) = make_experiment(store, [{"lr": 0.1}, {"lr": 0.01}])
    add_points(store, t1, "loss", LOSS)
    big = [(3, 0.25, 1_700_000_003.0), (1, 2e-300, 1_700_000_001.0), (4, -1e300, 1.7e9 + 4)]
    add_points(store, t1, "val_loss", big)
    add_points(store, t2, "loss", [(5, -1.5e10, 1_700_000_010.0)])
    result = tb.export_tensorboard(store, exp_id)
    assert (result.trials, result.points, result.files, result.rewritten) == (2, 7, 2, [])
    assert result.logdir == store.runs_root / "exp-000001-tb" / "tensorboard"
    assert_same_as_db(store, [t1, t2])
    assert db_points(store, t1)["loss"][1][1] is None  # the NaN is in the test
    # float32, as TensorBoard's scalars: 1/3 rounded, 2e-300 to 0, -1e300 to -inf
    assert read_points(trial_folder(store, t1))["val_loss"] == [
        (1, 0.0, 1_700_000_001.0),
        (3, 0.25, 1_700_000_003.0),
        (4, -math.inf, 1.7e9 + 4),
    ]
    assert read_points(trial_folder(store, t1))["loss"][2][1] == float32(1 / 3) != 1 / 3
    # no temp file, and nothing TensorBoard would read but the event files
    names = sorted(p.name for p in trial_folder(store, t1).iterdir())
    assert names == [".dlhpc-tensorboard.json", "events.out.tfevents.00000001.dlhpc"]


def test_a_second_export_writes_only_the_new_points(store: Store) -> None:
    exp_id, (t1,) = make_experiment(store, [{"lr": 0.1}])
    add_points(store, t1, "loss", LOSS)
    tb.export_tensorboard(store, exp_id)
    add_points(store, t1, "loss", [(4, 0.2, 1_700_000_004.0), (5, 0.1, 1_700_000_005.0)])
    add_points(store, t1, "acc", [(4, 0.9, 1_700_000_004.5)])
    result = tb.export_tensorboard(store, exp_id)
    assert (result.points, result.files, result.rewritten) == (3, 1, [])
    folder = trial_folder(store, t1)
    second = sorted(p.name for p in folder.glob("events.out.tfevents.*"))
    assert second == ["events.out.tfevents.00000001.dlhpc", "events.out.tfevents.00000002.dlhpc"]
    assert_same_as_db(store, [t1])  # every point once: none lost, none twice
    again = tb.export_tensorboard(store, exp_id)
    assert (again.points, again.files) == (0, 0)
    assert_same_as_db(store, [t1])


def test_the_second_file_holds_the_new_points_only(store: Store, tmp_path: Path) -> None:
    exp_id, (t1,) = make_experiment(store, [{"lr": 0.1}])
    add_points(store, t1, "loss", LOSS)
    tb.export_tensorboard(store, exp_id)
    add_points(store, t1, "loss", [(4, 0.2, 1_700_000_004.0)])
    tb.export_tensorboard(store, exp_id)
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "events.out.tfevents.x").write_bytes(
        (trial_folder(store, t1) / "events.out.tfevents.00000002.dlhpc").read_bytes()
    )
    assert read_points(alone) == {"loss": [(4, float32(0.2), 1_700_000_004.0)]}


def test_a_late_point_before_the_last_step_rewrites_the_trial(store: Store) -> None:
    exp_id, (t1,) = make_experiment(store, [{"lr": 0.1}])
    add_points(store, t1, "loss", LOSS)
    tb.export_tensorboard(store, exp_id)
    add_points(store, t1, "loss", [(0, 9.0, 1_699_999_999.0)])  # step 0 arrives after step 3
    result = tb.export_tensorboard(store, exp_id)
    assert (result.rewritten, result.points, result.files) == ([t1], 4, 1)
    files = sorted(p.name for p in trial_folder(store, t1).glob("events.out.tfevents.*"))
    assert files == ["events.out.tfevents.00000002.dlhpc"]  # numbered after the old one
    assert_same_as_db(store, [t1])
    hp = accumulator(trial_folder(store, t1)).PluginTagToContent(metadata.PLUGIN_NAME)
    assert metadata.SESSION_START_INFO_TAG in hp  # the new run has its session again


def test_many_small_exports_are_compacted_into_one_file(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tb, "MAX_FILES", 3)
    exp_id, (t1,) = make_experiment(store, [{"lr": 0.1}])
    for step in range(1, 5):
        add_points(store, t1, "loss", [(step, 1 / step, 1.7e9 + step)])
        result = tb.export_tensorboard(store, exp_id)
        assert result.rewritten == ([t1] if step == 4 else []), step
        assert_same_as_db(store, [t1])
    files = sorted(p.name for p in trial_folder(store, t1).glob("events.out.tfevents.*"))
    assert files == ["events.out.tfevents.00000004.dlhpc"]
    assert tb.export_tensorboard(store, exp_id).files == 0  # nothing new: left as it is


def test_a_crash_between_the_file_and_its_watermark_loses_and_repeats_nothing(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    exp_id, (t1,) = make_experiment(store, [{"lr": 0.1}])
    add_points(store, t1, "loss", LOSS[:2])
    tb.export_tensorboard(store, exp_id)
    add_points(store, t1, "loss", LOSS[2:])
    real = tb._write_watermark

    def crash(folder: Path, mark: Any) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(tb, "_write_watermark", crash)
    with pytest.raises(DlhpcError, match="cannot write TensorBoard files"):
        tb.export_tensorboard(store, exp_id)
    assert len(list(trial_folder(store, t1).glob("events.out.tfevents.*"))) == 2  # torn state
    monkeypatch.setattr(tb, "_write_watermark", real)
    add_points(store, t1, "loss", [(7, 0.7, 1_700_000_007.0)])
    result = tb.export_tensorboard(store, exp_id)
    assert result.rewritten == [t1]
    assert_same_as_db(store, [t1])


def test_a_lost_watermark_rewrites_instead_of_repeating(store: Store) -> None:
    exp_id, (t1,) = make_experiment(store, [{"lr": 0.1}])
    add_points(store, t1, "loss", LOSS)
    tb.export_tensorboard(store, exp_id)
    (trial_folder(store, t1) / tb.WATERMARK_FILE).write_text("{not json")
    assert tb.export_tensorboard(store, exp_id).rewritten == [t1]
    assert_same_as_db(store, [t1])


def test_hparams_sessions_and_the_experiment_definition(store: Store) -> None:
    hps = [
        {"lr": 0.1, "opt": "adam", "nested": {"depth": 2}, "flag": True, "skip": None},
        {"lr": 0.01, "opt": "<script>x</script>", "nested": {"depth": 3}, "flag": False},
    ]
    exp_id, (t1, t2) = make_experiment(store, hps, user="ann")
    add_points(store, t1, "val_loss", [(1, 0.5, 1_700_000_000.0)])
    add_points(store, t2, "acc", [(1, 0.5, 1_700_000_000.0)])
    with store.write() as s:
        s.get(Trial, t1).state, s.get(Trial, t1).ended_at = "COMPLETED", utcnow()  # type: ignore[union-attr]
    tb.export_tensorboard(store, exp_id)
    sessions = {}
    for t in (t1, t2):
        content = accumulator(trial_folder(store, t)).PluginTagToContent(metadata.PLUGIN_NAME)
        start = metadata.parse_session_start_info_plugin_data(
            content[metadata.SESSION_START_INFO_TAG]
        )
        sessions[t] = (start, content)
    start1, content1 = sessions[t1]
    assert {k: v.WhichOneof("kind") for k, v in start1.hparams.items()} == {
        "lr": "number_value", "opt": "string_value", "nested.depth": "number_value",
        "flag": "bool_value",
    }  # fmt: skip
    assert start1.hparams["lr"].number_value == 0.1 and start1.hparams["opt"].string_value == "adam"
    assert sessions[t2][0].hparams["opt"].string_value == "<script>x</script>"
    assert start1.group_name == f"trial-{t1:06d}"
    end = metadata.parse_session_end_info_plugin_data(content1[metadata.SESSION_END_INFO_TAG])
    assert end.status == api_pb2.STATUS_SUCCESS
    assert metadata.SESSION_END_INFO_TAG not in sessions[t2][1]  # still running
    root = accumulator(store.runs_root / "exp-000001-tb" / "tensorboard")
    exp = metadata.parse_experiment_plugin_data(
        root.PluginTagToContent(metadata.PLUGIN_NAME)[metadata.EXPERIMENT_TAG]
    )
    assert [m.name.tag for m in exp.metric_infos] == ["val_loss", "acc"]  # searcher's first
    infos = {h.name: h for h in exp.hparam_infos}
    assert sorted(infos) == ["flag", "lr", "nested.depth", "opt"]
    assert infos["lr"].type == api_pb2.DATA_TYPE_FLOAT64
    assert (infos["lr"].domain_interval.min_value, infos["lr"].domain_interval.max_value) == (
        0.01,
        0.1,
    )
    assert infos["flag"].type == api_pb2.DATA_TYPE_BOOL
    assert [v.string_value for v in infos["opt"].domain_discrete.values] == [
        "<script>x</script>",
        "adam",
    ]
    assert (exp.description, exp.user) == ("tb <b>", "ann")


def test_a_hyperparameter_of_mixed_types_is_a_string_column_everywhere(store: Store) -> None:
    exp_id, (t1, t2) = make_experiment(store, [{"bs": 32, "n": 3}, {"bs": "auto", "n": 4}])
    tb.export_tensorboard(store, exp_id)
    root = accumulator(store.runs_root / "exp-000001-tb" / "tensorboard")
    exp = metadata.parse_experiment_plugin_data(
        root.PluginTagToContent(metadata.PLUGIN_NAME)[metadata.EXPERIMENT_TAG]
    )
    infos = {h.name: h for h in exp.hparam_infos}
    assert infos["bs"].type == api_pb2.DATA_TYPE_STRING
    assert [v.string_value for v in infos["bs"].domain_discrete.values] == ["32", "auto"]
    assert infos["n"].type == api_pb2.DATA_TYPE_FLOAT64
    content = accumulator(trial_folder(store, t1)).PluginTagToContent(metadata.PLUGIN_NAME)
    start = metadata.parse_session_start_info_plugin_data(content[metadata.SESSION_START_INFO_TAG])
    assert start.hparams["bs"].string_value == "32" and start.hparams["n"].number_value == 3


def test_a_trial_folder_that_is_a_symlink_out_of_the_run_folder_is_refused(
    store: Store, tmp_path: Path
) -> None:
    exp_id, (t1,) = make_experiment(store, [{"lr": 0.1}])
    add_points(store, t1, "loss", LOSS)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "events.out.tfevents.keep").write_bytes(b"not ours")
    trial_folder(store, t1).parent.mkdir(parents=True)
    trial_folder(store, t1).symlink_to(elsewhere)
    with pytest.raises(UnsafePathError, match="is not inside"):
        tb.export_tensorboard(store, exp_id)
    assert [p.name for p in elsewhere.iterdir()] == ["events.out.tfevents.keep"]


def test_the_end_of_a_trial_is_written_once_when_it_ends(store: Store) -> None:
    exp_id, (t1,) = make_experiment(store, [{"lr": 0.1}])
    add_points(store, t1, "loss", LOSS)
    tb.export_tensorboard(store, exp_id)
    with store.write() as s:
        s.get(Trial, t1).state, s.get(Trial, t1).ended_at = "FAILED", utcnow()  # type: ignore[union-attr]
    assert tb.export_tensorboard(store, exp_id).files == 1  # the session end alone
    assert tb.export_tensorboard(store, exp_id).files == 0
    content = accumulator(trial_folder(store, t1)).PluginTagToContent(metadata.PLUGIN_NAME)
    end = metadata.parse_session_end_info_plugin_data(content[metadata.SESSION_END_INFO_TAG])
    assert end.status == api_pb2.STATUS_FAILURE
    assert_same_as_db(store, [t1])


def test_the_scalars_and_hparams_tabs_see_every_trial(store: Store) -> None:
    from tensorboard import context
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer

    exp_id, (t1, t2) = make_experiment(store, [{"lr": 0.1}, {"lr": 0.01}])
    add_points(store, t1, "val_loss", LOSS)
    add_points(store, t2, "val_loss", [(1, 0.75, 1_700_000_000.0)])
    logdir = tb.export_tensorboard(store, exp_id).logdir
    mux = plugin_event_multiplexer.EventMultiplexer(tensor_size_guidance={"scalars": 0})
    mux.AddRunsFromDirectory(str(logdir))
    mux.Reload()
    provider = data_provider.MultiplexerDataProvider(mux, str(logdir))
    ctx = context.RequestContext()
    scalars = provider.read_scalars(ctx, experiment_id="", plugin_name="scalars", downsample=100)
    assert set(scalars) == {f"trial-{t1:06d}", f"trial-{t2:06d}"}
    got = [(d.step, d.value, d.wall_time) for d in scalars[f"trial-{t1:06d}"]["val_loss"]]
    assert [(s, None if math.isnan(v) else v, w) for s, v, w in got] == [
        (s, float32(v), w) for s, v, w in LOSS
    ]
    hp = provider.list_tensors(ctx, experiment_id="", plugin_name=metadata.PLUGIN_NAME)
    assert set(hp) == {".", f"trial-{t1:06d}", f"trial-{t2:06d}"}


def test_unknown_experiment_and_missing_tensorboard_are_usage_errors(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(NotFoundError, match="no experiment 99"):
        tb.export_tensorboard(store, 99)
    exp_id, _ = make_experiment(store, [{"lr": 0.1}])
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "tensorboard" else find_spec(name, *a),
    )
    with pytest.raises(UsageError, match=r"pip install 'dlhpc\[tensorboard\]'") as err:
        tb.export_tensorboard(store, exp_id)
    assert err.value.exit_code == 2
    assert not (store.runs_root / "exp-000001-tb" / "tensorboard").exists()  # nothing written


class _CrashAt:
    """File operations that fail with EIO at the ``k``-th call (publish or delete)."""

    def __init__(self, k: int) -> None:
        self.k, self.calls = k, 0
        self.publish, self.unlink = tb._publish, Path.unlink

    def _tick(self) -> None:
        self.calls += 1
        if self.calls == self.k:
            raise OSError(5, "Input/output error")

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        def publish(path: Path, data: bytes) -> None:
            self._tick()
            self.publish(path, data)

        def unlink(path: Path, missing_ok: bool = False) -> None:
            self._tick()
            self.unlink(path, missing_ok)

        monkeypatch.setattr(tb, "_publish", publish)
        monkeypatch.setattr(Path, "unlink", unlink)


@pytest.mark.parametrize("late", [False, True], ids=["append", "rewrite"])
def test_a_crash_at_any_write_or_delete_is_repaired_by_the_next_export(
    store: Store, monkeypatch: pytest.MonkeyPatch, late: bool
) -> None:
    """Kill the export at its k-th file operation (publish or delete), for every k of an
    export; the next export leaves every point in exactly one file."""
    exp_id, (t1, t2) = make_experiment(store, [{"lr": 0.1}, {"lr": 0.2}])
    add_points(store, t1, "loss", LOSS[:2])
    add_points(store, t2, "loss", LOSS[:2])
    tb.export_tensorboard(store, exp_id)
    add_points(store, t1, "loss", [(0, 3.0, 1_699_999_999.0)] if late else LOSS[2:])
    add_points(store, t2, "loss", LOSS[2:])
    snapshot = {p: p.read_bytes() for p in store.runs_root.rglob("*") if p.is_file()}
    crashed_at = []
    for k in range(1, 12):
        for p in list(store.runs_root.rglob("*")):  # back to the state after the first export
            if p.is_file() and p not in snapshot:
                p.unlink()
        for p, data in snapshot.items():
            p.write_bytes(data)
        _CrashAt(k).install(monkeypatch)
        try:
            tb.export_tensorboard(store, exp_id)
        except DlhpcError:
            crashed_at.append(k)
        monkeypatch.undo()
        tb.export_tensorboard(store, exp_id)
        assert_same_as_db(store, [t1, t2])
    # per trial a file and its watermark; a rewrite of t1 deletes its old file first
    assert crashed_at == list(range(1, 5 + (1 if late else 0)))
