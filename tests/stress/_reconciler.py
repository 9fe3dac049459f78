"""``python -m tests.stress._reconciler ARGS...``: the real ``dlhpc`` command line,
with the stress tests' scheduler backend registered under ``stress`` (as the
simulator registers ``sim``).

Once imported it creates ``$STRESS_READY_DIR/<pid>`` (the writers start once every
reconciler is up) and, given ``$STRESS_GATE_FD``, blocks reading
one byte from that pipe: processes released together start at the same moment.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from dlhpc.cli.main import cli

if __name__ == "__main__":
    os.environ["DLHPC_SCHEDULERS"] = "stress=tests.stress._backend:BACKEND"
    if os.environ.get("STRESS_READY_DIR"):
        (Path(os.environ["STRESS_READY_DIR"]) / str(os.getpid())).touch()
    if os.environ.get("STRESS_GATE_FD"):
        os.read(int(os.environ["STRESS_GATE_FD"]), 1)
    cli.main(args=sys.argv[1:], prog_name="dlhpc")
