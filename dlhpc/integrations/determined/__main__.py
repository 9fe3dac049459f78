"""``python -m dlhpc.integrations.determined COMMAND...``: run COMMAND with the stand-in
``determined`` package first on ``PYTHONPATH``.

The process is replaced (``execvp``), so it keeps its pid and receives the signals the
worker forwards (TERM at preemption, USR2 before the time limit) itself. Child
processes the script starts inherit ``PYTHONPATH`` and see the stand-in too.
Exit code 2 (and a one-line reason) when no command is given or it cannot be run.
"""

from __future__ import annotations

import os
import sys

from dlhpc.integrations.determined import SHIM_PATH


def main(argv: list[str]) -> int:
    """Exec ``argv`` with :data:`SHIM_PATH` prepended to ``PYTHONPATH``; returns only on error."""
    if not argv or argv[0] in ("-h", "--help"):
        print(
            "usage: python -m dlhpc.integrations.determined COMMAND [ARGS...]\n"
            "  runs COMMAND (e.g. python3 train.py) with dlhpc's stand-in for Determined's"
            " Core API importable as `determined`",
            file=sys.stderr,
        )
        return 2
    env = dict(os.environ)
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([str(SHIM_PATH), *parts])
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as err:
        print(f"dlhpc.integrations.determined: cannot run {argv[0]!r}: {err}", file=sys.stderr)
        return 2
    return 2  # pragma: no cover - execvpe does not return


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
