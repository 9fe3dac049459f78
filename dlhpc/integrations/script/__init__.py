"""Plain scripts with zero added lines: ``entrypoint: python train.py --lr {lr}``.

An entrypoint with ``{name}`` placeholders (or an experiment with a ``script:``
section) runs under this runner instead of a shell (see docs/USER_GUIDE.md,
"Plain scripts"): entry.sh runs ``python -m dlhpc.integrations.script [--metrics-pattern
REGEX] -- TOKEN...``, which fills each token from ``trial.json`` (one argv item per
token, never a shell), starts the script, reports its metrics (stdout lines matching
the pattern, and the JSON-lines file named by ``$DLHPC_METRICS_FILE``), registers its
complete checkpoints as dlhpc checkpoints, forwards TERM/USR2 and turns a stop
decision into a TERM. :func:`main` is the command; :class:`ScriptRunner` the runner.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m dlhpc.integrations.script [--metrics-pattern REGEX] -- TOKEN...``:
    run one trial's script; returns the exit code (2: bad usage or not in a dlhpc job)."""
    from dlhpc.errors import DlhpcError
    from dlhpc.harness.entry import init
    from dlhpc.integrations.script._runner import ScriptRunner

    parser = argparse.ArgumentParser(prog="python -m dlhpc.integrations.script")
    parser.add_argument("--metrics-pattern", default=None)
    parser.add_argument("tokens", nargs="+", help="the entrypoint template's tokens, after --")
    args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    try:
        ctx = init()
        runner = ScriptRunner(ctx, args.tokens, args.metrics_pattern)
    except (DlhpcError, ValueError) as exc:
        print(f"dlhpc script runner: {exc}", file=sys.stderr)
        return 2
    return runner.run()
