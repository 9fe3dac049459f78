"""``python -m dlhpc.integrations.determined COMMAND...``: run COMMAND with the stand-in
``determined`` package first on ``PYTHONPATH``.

The process is replaced (``execvp``), so it keeps its pid and receives the signals the
worker forwards (TERM at preemption, USR2 before the time limit) itself. Child
processes the script starts inherit ``PYTHONPATH`` and see the stand-in too.
Exit code 2 (and a one-line reason) when no command is given or it cannot be run.

``sh -c STRING`` (how Determined runs a string entrypoint, and what ``dlhpc convert``
writes) whose STRING is one simple command (no shell syntax, a program on ``PATH``) runs
that command in place of the shell, as bash does with ``-c``: dash would stay its parent
and end at the TERM of a preemption while the script still checkpoints.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys

from dlhpc.integrations.determined import SHIM_PATH

# what makes a string more than one simple command for sh (operators, expansions, quoting
# the words alone cannot express, comments)
_SHELL_SYNTAX = set(";&|<>()$`\\*?[]{}~#!\n")


def simple_command(argv: list[str]) -> list[str]:
    """``argv``, or for ``sh -c STRING`` with a simple STRING the words of STRING."""
    if len(argv) != 3 or argv[:2] != ["sh", "-c"] or _SHELL_SYNTAX & set(argv[2]):
        return argv
    try:
        words = shlex.split(argv[2])
    except ValueError:
        return argv
    if not words or "=" in words[0] or shutil.which(words[0]) is None:
        return argv  # an assignment, a builtin or keyword: the shell's
    return words


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
    argv = simple_command(argv)
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as err:
        print(f"dlhpc.integrations.determined: cannot run {argv[0]!r}: {err}", file=sys.stderr)
        return 2
    return 2  # pragma: no cover - execvpe does not return


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
