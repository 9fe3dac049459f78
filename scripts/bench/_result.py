"""The JSON result file a benchmark writes with ``--json PATH``.

:func:`write_result` adds what a reader needs to judge the figures (when, the command, the
machine and its load) to the benchmark's own result and writes it, indented, to ``path``.
A benchmark imports it with ``scripts/bench`` on ``sys.path``.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def _command() -> str:
    """The command line as it was run, the script's path relative to the repository
    (``python -m NAME`` for a module run as one)."""
    main = sys.modules["__main__"]
    spec = getattr(main, "__spec__", None)
    if spec is not None and getattr(main, "__file__", None) == sys.argv[0]:
        return shlex.join(["python", "-m", spec.name, *sys.argv[1:]])
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(REPO) if script.is_relative_to(REPO) else script
    return shlex.join(["python", str(shown), *sys.argv[1:]])


def write_result(path: Path, result: dict[str, Any]) -> None:
    """Writes ``result`` under ``"result"`` with the date (UTC), the command, the machine
    (CPUs, OS, Python) and the 1/5/15-minute load averages at the end of the run."""
    record = {
        "date_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": _command(),
        "machine": {
            "cpus": os.cpu_count(),
            "system": f"{platform.system()} {platform.release()}",
            "python": platform.python_version(),
            "loadavg_1_5_15_min_at_end": [round(x, 2) for x in os.getloadavg()],
        },
        "result": result,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
