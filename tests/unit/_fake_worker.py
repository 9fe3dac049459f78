"""Stand-in for ``python -m dlhpc.harness.worker TRIAL_DIR`` in the local backend tests.

Behaviour comes from files in the trial folder: ``sleep`` (seconds to sleep,
default 0) and ``exit`` (exit code, default 0). It writes ``ran.json`` with
its job id, pid and start/end times, and exits with the configured code.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def main() -> int:
    trial = Path(sys.argv[1])
    start = time.time()
    (trial / "started").write_text(os.environ.get("DLHPC_JOB_ID", ""), encoding="utf-8")
    sleep = trial / "sleep"
    time.sleep(float(sleep.read_text()) if sleep.exists() else 0.0)
    code_file = trial / "exit"
    code = int(code_file.read_text()) if code_file.exists() else 0
    record = {
        "job_id": os.environ.get("DLHPC_JOB_ID"),
        "extra": os.environ.get("EXTRA"),
        "pid": os.getpid(),
        "start": start,
        "end": time.time(),
    }
    (trial / "ran.json").write_text(json.dumps(record), encoding="utf-8")
    print(f"fake worker {record['job_id']} says hi")
    print("to stderr", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
