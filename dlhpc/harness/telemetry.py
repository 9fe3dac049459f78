"""GPU telemetry: per-GPU utilization, memory and power, sampled on each node of a job.

The worker of local rank 0 on every node starts a :class:`GpuSampler` (see
:func:`start_gpu_sampler`). Every ``interval_s`` it reads, through NVML
(``nvidia-ml-py``, imported as ``pynvml``), the GPUs this job may use
(``CUDA_VISIBLE_DEVICES`` by index or UUID, else every GPU NVML shows) and
publishes the samples into the attempt's folder as immutable event files of
stream ``gpu-n<node id>``, one record per sample::

    {"type": "gpu", "time", "host", "gpus": [{"index", "util", "mem_used", "mem_total",
                                              "power_w"}]}

(``util`` in percent, memory in bytes; a value NVML cannot give is null). Files
are published every ``flush_every`` samples and at stop. Without NVML (no
``pynvml``, no driver: a CPU node) it is a no-op that prints one info line.
When a GPU counts as idle is :mod:`dlhpc.protocol.gpu`'s rule, shared with
``dlhpc status``; so is :func:`~dlhpc.protocol.gpu.load_nvml`.

Standard library only (``pynvml`` is optional); nothing here may stop training:
sampling errors are counted and skipped.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dlhpc.protocol import EventWriter
from dlhpc.protocol.gpu import load_nvml

__all__ = ["GpuSampler", "start_gpu_sampler"]

INTERVAL_S = 5.0
FLUSH_EVERY = 12  # one file a minute at the default interval


def _handles(nvml: Any, environ: Mapping[str, str]) -> list[tuple[int, Any]]:
    """(index shown to CUDA, NVML handle) of the GPUs this job may use."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [(i, nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(nvml.nvmlDeviceGetCount())]
    out = []
    for i, item in enumerate(x.strip() for x in visible.split(",") if x.strip()):
        if item.isdigit():
            out.append((i, nvml.nvmlDeviceGetHandleByIndex(int(item))))
        else:  # GPU-<uuid> or MIG-<uuid>
            out.append((i, nvml.nvmlDeviceGetHandleByUUID(item)))
    return out


def _read(call: Any, *args: Any) -> Any:
    try:
        return call(*args)
    except Exception:  # e.g. NVMLError_NotSupported (power on some boards)
        return None


class GpuSampler(threading.Thread):
    """Samples the visible GPUs every ``interval_s`` into ``attempt_dir`` until stopped."""

    def __init__(
        self,
        nvml: Any,
        attempt_dir: Path,
        node_id: int = 0,
        *,
        environ: Mapping[str, str] | None = None,
        interval_s: float = INTERVAL_S,
        flush_every: int = FLUSH_EVERY,
    ) -> None:
        super().__init__(name="dlhpc-gpu-telemetry", daemon=True)
        self.nvml = nvml
        self.handles = _handles(nvml, os.environ if environ is None else environ)
        self.writer = EventWriter(attempt_dir, f"gpu-n{node_id}")
        self.host = socket.gethostname()
        self.interval_s = interval_s
        self.flush_every = max(1, flush_every)
        self.stopped = threading.Event()
        self.errors = 0

    def sample(self) -> None:
        gpus = []
        for index, h in self.handles:
            util = _read(self.nvml.nvmlDeviceGetUtilizationRates, h)
            mem = _read(self.nvml.nvmlDeviceGetMemoryInfo, h)
            power = _read(self.nvml.nvmlDeviceGetPowerUsage, h)  # milliwatts
            gpus.append(
                {
                    "index": index,
                    "util": None if util is None else int(util.gpu),
                    "mem_used": None if mem is None else int(mem.used),
                    "mem_total": None if mem is None else int(mem.total),
                    "power_w": None if power is None else power / 1000.0,
                }
            )
        self.writer.add("gpu", host=self.host, gpus=gpus)

    def _flush(self) -> None:
        try:
            self.writer.flush()
        except OSError:  # a full or flaky file system must not stop training
            self.errors += 1

    def run(self) -> None:
        while True:
            try:
                self.sample()
            except Exception:
                self.errors += 1
            if self.writer.pending() >= self.flush_every:
                self._flush()
            if self.stopped.wait(self.interval_s):
                break
        self._flush()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop sampling and publish what is buffered (waits for the thread)."""
        self.stopped.set()
        if self.is_alive():
            self.join(timeout)
        with contextlib.suppress(Exception):
            self.nvml.nvmlShutdown()


def start_gpu_sampler(
    attempt_dir: Path, environ: Mapping[str, str], node_id: int = 0, interval_s: float = INTERVAL_S
) -> GpuSampler | None:
    """A started sampler on this node (``node_id``: its index among the job's nodes,
    from the job environment), or None (printing one info line) without NVML or
    without GPUs. Call it from local rank 0 only."""
    nvml, why = load_nvml()
    if nvml is None:
        print(f"[dlhpc info] GPU telemetry off: NVML unavailable ({why})", file=sys.stderr)
        return None
    try:
        sampler = GpuSampler(nvml, attempt_dir, node_id, environ=environ, interval_s=interval_s)
    except Exception as err:
        print(f"[dlhpc info] GPU telemetry off: {type(err).__name__}: {err}", file=sys.stderr)
        return None
    if not sampler.handles:
        print("[dlhpc info] GPU telemetry off: no GPU visible", file=sys.stderr)
        return None
    sampler.start()
    return sampler
