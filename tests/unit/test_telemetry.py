"""GPU telemetry: samples through NVML into the attempt's files; a no-op without NVML."""

from __future__ import annotations

import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest

from dlhpc.harness import telemetry
from dlhpc.protocol import gpu, read_event_batches


class FakeNvml:
    """The part of pynvml the sampler uses: 4 GPUs; GPU 2 reports no power."""

    def __init__(self) -> None:
        self.shut = False

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        self.shut = True

    def nvmlDeviceGetCount(self) -> int:
        return 4

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        return int(uuid.rsplit("-", 1)[1])

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return types.SimpleNamespace(gpu=10 * h, memory=0)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return types.SimpleNamespace(used=h << 30, total=80 << 30, free=0)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        if h == 2:
            raise RuntimeError("NVMLError_NotSupported")
        return 100_000 + h


def _records(attempt: Path) -> list[dict[str, Any]]:
    return [r for b in read_event_batches(attempt) for r in b.records]


def test_the_sampler_records_the_visible_gpus_until_stopped(tmp_path: Path) -> None:
    nvml = FakeNvml()
    env = {"CUDA_VISIBLE_DEVICES": "3,GPU-uuid-2"}
    sampler = telemetry.GpuSampler(nvml, tmp_path, 1, environ=env, interval_s=0.01, flush_every=5)
    sampler.start()
    time.sleep(0.2)
    sampler.stop()
    assert not sampler.is_alive() and nvml.shut and sampler.errors == 0
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) >= 2 and all(f.startswith("gpu-n1-") for f in files)
    recs = _records(tmp_path)
    assert len(recs) >= 5 and {r["type"] for r in recs} == {"gpu"}
    assert recs[0]["gpus"] == [
        {"index": 0, "util": 30, "mem_used": 3 << 30, "mem_total": 80 << 30, "power_w": 100.003},
        {"index": 1, "util": 20, "mem_used": 2 << 30, "mem_total": 80 << 30, "power_w": None},
    ]


def test_without_nvml_it_is_a_no_op_with_one_info_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    assert telemetry.start_gpu_sampler(tmp_path, {}) is None
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "GPU telemetry off: NVML unavailable" in err
    assert list(tmp_path.iterdir()) == []


def test_with_nvml_the_worker_helper_starts_a_sampler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    sampler = telemetry.start_gpu_sampler(tmp_path, {}, 3, interval_s=0.01)
    assert sampler is not None and len(sampler.handles) == 4
    sampler.stop()
    assert {p.name.split("-0")[0] for p in tmp_path.iterdir()} == {"gpu-n3"}


def test_idle_gpus_are_those_below_the_threshold_for_the_whole_window() -> None:
    def rec(t: float, utils: list[int | None], host: str = "n1") -> dict[str, Any]:
        gpus = [{"index": i, "util": u} for i, u in enumerate(utils)]
        return {"type": "gpu", "time": t, "host": host, "gpus": gpus}

    records = [rec(t, [0, 95, 5 if t < 600 else 50, None]) for t in range(0, 901, 30)]
    records.append({"type": "metric", "time": 1.0})
    assert gpu.idle_gpus(records, below_pct=10, window_s=600) == [("n1", 0)]
    assert gpu.idle_gpus(records, window_s=1000) == []  # window not covered yet
    assert gpu.idle_gpus([rec(0, [1]), rec(700, [2], "n2")], window_s=600) == []
