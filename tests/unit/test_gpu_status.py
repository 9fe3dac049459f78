"""GPU telemetry in the store and in ``dlhpc status``: exactly-once ingest, idle GPUs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import func, select

from dlhpc.protocol import EventWriter, gpu
from dlhpc.report.status import status_data
from dlhpc.store import Attempt, GpuSample, Store, Trial, utcnow
from dlhpc.store.ingest import ingest_attempt
from tests.unit._db import exp_and_trial

T0 = 1_700_000_000.0
END = T0 + 660  # 11 minutes of samples, every 30 s


def _write_samples(adir: Path) -> None:
    """node1 GPU 0 below 10% for 11 min; node1 GPU 1 busy 5 min ago; node2 GPU 0 idle but
    sampled for 8 min only. Published as several files of two streams."""
    n1, n2 = EventWriter(adir, "gpu-n0"), EventWriter(adir, "gpu-n1")
    for i in range(23):
        t = T0 + 30 * i
        gpu1 = 80 if t == END - 300 else 2
        n1.add(
            "gpu",
            time=t,
            host="node1",
            gpus=[
                {
                    "index": 0,
                    "util": 3,
                    "mem_used": 1 << 30,
                    "mem_total": 80 << 30,
                    "power_w": 70.5,
                },
                {"index": 1, "util": gpu1, "mem_used": 2 << 30, "mem_total": 80 << 30},
                {"util": 50},  # no index: skipped
            ],
        )
        if t >= END - 480:
            n2.add("gpu", time=t, host="node2", gpus=[{"index": 0, "util": 0, "power_w": None}])
        if i % 6 == 5:
            n1.flush()
    n1.flush()
    n2.flush()


def _ingest(store: Store, tid: int, adir: Path) -> int:
    with store.write() as s:
        t = s.get(Trial, tid)
        assert t is not None
        return ingest_attempt(s, t, adir, utcnow()).files


def _count(store: Store) -> int:
    with store.read() as s:
        return int(s.scalar(select(func.count()).select_from(GpuSample)) or 0)


@pytest.fixture
def running(tmp_path: Path) -> tuple[Store, int, Path]:
    store = Store(tmp_path / "home")
    tid = exp_and_trial(store, tmp_path, name="gpu-exp")
    adir = tmp_path / "t" / "attempts" / "123_4.r0"
    _write_samples(adir)
    return store, tid, adir


def test_gpu_records_are_ingested_exactly_once(running: tuple[Store, int, Path]) -> None:
    store, tid, adir = running
    assert _ingest(store, tid, adir) == 5  # 4 files of node1, 1 of node2
    rows = 23 * 2 + 17
    assert _count(store) == rows
    assert _ingest(store, tid, adir) == 0 and _count(store) == rows
    # the same samples under another file name (a re-published batch) add no rows
    first = sorted(adir.glob("gpu-n0-*.jsonl"))[0]
    shutil.copy(first, adir / "gpu-n0-00000099.jsonl")
    assert _ingest(store, tid, adir) == 1 and _count(store) == rows
    with store.read() as s:
        g = s.scalars(
            select(GpuSample).where(GpuSample.host == "node1", GpuSample.gpu_index == 0)
        ).first()
        assert g is not None and g.util == 3 and g.mem_total == 80 << 30 and g.power_w == 70.5


def test_status_flags_only_a_gpu_idle_for_the_whole_window(
    running: tuple[Store, int, Path],
) -> None:
    store, tid, adir = running
    _ingest(store, tid, adir)
    with store.read() as s:
        (exp,) = status_data(s).to_json()["experiments"]
    (trial,) = exp["trials"]
    expected = {
        "trial_id": tid,
        "attempt_key": "123_4.r0",
        "host": "node1",
        "gpu_index": 0,
        "idle_minutes": 11.0,
        "idle_since": "2023-11-14T22:13:20Z",
        "below_pct": 10.0,
    }
    assert exp["idle_gpus"] == trial["idle_gpus"] == [expected]
    summary: dict[str, Any] = {
        "gpus": 3,
        "util_mean": round((23 * 3 + 22 * 2 + 80) / (23 * 2 + 17), 1),
        "last_sample_at": "2023-11-14T22:24:20Z",
    }
    assert trial["attempts"][0]["gpu"] == summary
    assert trial["gpu"] == {"attempt_key": "123_4.r0", **summary}
    # a longer window is not covered by the samples yet
    with store.read() as s:
        (exp,) = status_data(s, idle_window_s=700).to_json()["experiments"]
    assert exp["idle_gpus"] == []


def test_an_ended_attempt_is_not_flagged(running: tuple[Store, int, Path]) -> None:
    store, tid, adir = running
    w = EventWriter(adir, "worker-r0")
    w.add("exit", time=END + 1, code=0, reason="completed")
    w.flush()
    _ingest(store, tid, adir)
    with store.read() as s:
        a = s.scalar(select(Attempt))
        assert a is not None and a.state == "RUNNING" and a.ended_at is not None
        (exp,) = status_data(s).to_json()["experiments"]
    assert exp["idle_gpus"] == [] and exp["trials"][0]["gpu"]["gpus"] == 3
    with store.write() as s:  # the scheduler's word alone ends it too
        a = s.scalar(select(Attempt))
        assert a is not None
        a.state, a.ended_at = "COMPLETED", None
    with store.read() as s:
        assert status_data(s).to_json()["experiments"][0]["idle_gpus"] == []


def test_cli_status_warns_and_shows_idle_gpus_in_json(
    running: tuple[Store, int, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from dlhpc.cli.main import cli

    store, tid, adir = running
    _ingest(store, tid, adir)
    monkeypatch.setenv("DLHPC_HOME", str(store.home))
    monkeypatch.setenv("DLHPC_SITE", "local")
    res = CliRunner().invoke(cli, ["status"])
    assert res.exit_code == 0, res.output
    assert f"GPU idle: trial {tid} on node1 GPU 0 below 10% for 11 min" in res.output
    assert res.output.count("GPU idle:") == 1
    assert "GPU util" in res.output and "3% x3" in res.output
    res = CliRunner().invoke(cli, ["status", "1", "--json"])
    assert res.exit_code == 0, res.output
    (exp,) = json.loads(res.output)["experiments"]
    assert [(g["host"], g["gpu_index"]) for g in exp["idle_gpus"]] == [("node1", 0)]


def test_the_idle_rule_judged_at_a_given_time() -> None:
    idle: list[tuple[float, Any]] = [(T0 + 30 * i, 1) for i in range(23)]
    assert gpu.idle_series(idle) == T0  # idle since its first sample
    assert gpu.idle_series(idle, now=END + 630) is None  # stopped reporting: unknown
    busy_then_idle = [(T0, 90), *idle[1:]]
    assert gpu.idle_series(busy_then_idle) == T0  # idle since its last busy sample
    assert gpu.idle_series([(T0, None), *idle[1:]]) == T0  # no reading counts as busy
    assert gpu.idle_series([*idle, (END + 30, 10)]) is None  # 10% is not below 10%
    assert gpu.idle_series([]) is None
