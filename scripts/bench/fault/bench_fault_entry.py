#!/usr/bin/env python3
"""Timing wrapper of ``bench_fault.py requeue``: runs a training script unchanged.

    python bench_fault_entry.py train.py     (the experiment's entrypoint, in the code snapshot)

Records, for the attempt it runs in, when the process was created (``/proc``), when this
wrapper started, when the imports ``train.py`` needs were done (it imports them first, then
they are cached), when ``TrainState.restore`` started and ended, and when the first
``ctx.step()`` call came (the end of the attempt's first training step). It patches those two
methods on the classes, from outside: ``dlhpc`` itself is unchanged. The record goes to
``$BENCH_FAULT_OUT/<attempt key>.json`` as soon as the first step is done.
"""

from __future__ import annotations

import time

T0 = time.time()

import atexit  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import runpy  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402


def _process_created() -> float | None:
    """Wall-clock time this process was created (10 ms resolution), from /proc.

    ``starttime`` counts clock ticks since boot (CLOCK_BOOTTIME); measuring its age on that
    clock avoids ``btime``, which is whole seconds and drifts from the wall clock in VMs.
    """
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 of stat
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - started
        return time.time() - age
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def main() -> None:
    script = sys.argv[1]
    out_dir = os.environ.get("BENCH_FAULT_OUT")
    key = Path(os.environ.get("DLHPC_ATTEMPT_DIR", "unknown")).name
    rec: dict[str, Any] = {
        "attempt": key,
        "pid": os.getpid(),
        "process_created": _process_created(),
        "wrapper_start": T0,
    }

    def write() -> None:
        if out_dir:
            path = Path(out_dir) / f"{key}.json"
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(rec))
            os.replace(tmp, path)

    # what train.py imports, so that their cost shows apart from the script's own work
    import numpy  # noqa: F401
    import sklearn.datasets  # noqa: F401
    import sklearn.model_selection  # noqa: F401
    import torch  # noqa: F401

    import dlhpc  # noqa: F401
    from dlhpc.harness.context import TrialContext
    from dlhpc.harness.state import TrainState

    rec["imports_done"] = time.time()
    plain_restore, plain_step = TrainState.restore, TrialContext.step

    def restore(self: TrainState) -> bool:
        rec["restore_start"] = time.time()
        found = plain_restore(self)
        rec["restore_end"] = time.time()
        rec["restored"], rec["restored_step"] = found, self.step
        return found

    def step(self: TrialContext, state: Any = None) -> None:
        if "first_step" not in rec:
            rec["first_step"] = time.time()
            rec["first_step_no"] = state.step if state is not None else None
            write()
        plain_step(self, state)

    def at_exit() -> None:  # registered before dlhpc.init(): runs after its flush
        if out_dir:
            rec_exit = {"atexit": time.time()}
            (Path(out_dir) / f"{key}.exit.json").write_text(json.dumps(rec_exit))

    atexit.register(at_exit)
    TrainState.restore = restore  # type: ignore[method-assign]
    TrialContext.step = step  # type: ignore[method-assign]
    sys.argv = [script, *sys.argv[2:]]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
