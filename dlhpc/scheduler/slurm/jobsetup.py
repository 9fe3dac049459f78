"""The job script's environment section: site modules, activation and setup lines run
by the batch shell BEFORE the worker's interpreter starts, with ``set -e`` semantics.

What the section does, in order (see :func:`setup_section`):

1. puts the worker interpreter's folder first on ``PATH`` (when it is a path), so that
   without an activation ``python`` in the entrypoint is the launch's, and an activation
   in the setup (which prepends its own folder) wins over it;
2. when a setup line runs ``module`` (or ``ml``) and the batch shell has no such
   command, sources the site's module system first (see :data:`_MODULE_INIT`);
3. runs every setup line (each section: ``site modules``, ``environment.setup``) under
   ``set -e``; the last line checks that the worker's interpreter starts and imports
   dlhpc and submitit;
4. on the first failing line, before the shell exits, publishes an event file
   (stream :data:`~dlhpc.protocol.SETUP_STREAM`) in the attempt's folder: an ``exit``
   record with reason ``setup`` and a ``log`` record naming the section, its line and
   the exit status; the reconciler ingests it like any event file, so the attempt
   ends with that reason and the trial's error says it (the message is also printed
   to the job's stderr log). A setup killed by a signal (status > 128) writes nothing:
   that is the scheduler's doing, not the setup's;
5. marks the setup done (``DLHPC_JOB_SETUP=done``) so that ``entry.sh`` does not run
   it again.

The attempt folder is found from the task's trial folder (``_dlhpc_trial``, which the
script read from the chunk's list by the array task index: see
:mod:`dlhpc.scheduler.slurm.sbatch`) and ``SLURM_ARRAY_JOB_ID``/``SLURM_RESTART_COUNT``,
as the worker names it (:func:`dlhpc.protocol.attempt_key`). The texts of the messages are
JSON-escaped here, so the shell only pastes them.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Sequence

from dlhpc.protocol.layout import ATTEMPTS_DIR, SETUP_DONE_VAR, SETUP_STREAM

__all__ = ["setup_section"]

_CHECK = "import dlhpc, submitit"

# On a real site ``module`` is a shell function that a login shell defines from
# /etc/profile.d (Lmod's lmod.sh also sets BASH_ENV to its init); a job under
# --export=ALL inherits it (BASH_FUNC_module%%, BASH_ENV) from the launch's saved
# environment. A launch from a shell without it (a non-login or non-bash shell, an IDE)
# leaves the job without ``module``: then the section sources the first init script
# that exists, Lmod's or Environment Modules', as a login shell would have.
_MODULE_INIT = (
    "if ! type module >/dev/null 2>&1; then",
    '  for _dlhpc_init in "${MODULESHOME:+$MODULESHOME/init/bash}" /etc/profile.d/lmod.sh \\',
    "      /etc/profile.d/modules.sh /usr/share/lmod/lmod/init/bash; do",
    '    if [ -n "$_dlhpc_init" ] && [ -r "$_dlhpc_init" ]; then',
    '      . "$_dlhpc_init" >/dev/null; break',
    "    fi",
    "  done",
    "fi",
)
_USES_MODULE = re.compile(r"^\s*(module|ml)(\s|$)")

# ``$?`` of the failing line is the function's first statement. The line: the ERR
# trap's (a top-level command) or, when set -e ended the shell inside a function,
# the top-level line that called it (BASH_LINENO's entry for ``main``).
_FAILED_FN = r"""_dlhpc_setup_failed() {
  local code=$? n=0 at dir tmp t
  if [ "$code" -eq 0 ] || [ "$code" -gt 128 ]; then return; fi
  at=${_dlhpc_err_line:-}
  if [ -z "$at" ] && [ "${#FUNCNAME[@]}" -gt 2 ]; then
    at=${BASH_LINENO[${#BASH_LINENO[@]}-2]}
  fi
  if [ -n "$at" ]; then n=$((at - _dlhpc_base)); fi
  if [ "$n" -ge 1 ] && [ "$n" -le "${#_dlhpc_lines[@]}" ]; then
    _dlhpc_msg="setup failed: ${_dlhpc_lines[n-1]} (exit $code)"
  else
    _dlhpc_msg="setup failed (exit $code); the job's log has the output"
  fi
  echo "dlhpc: $_dlhpc_msg" >&2
  dir="$_dlhpc_trial/@ATTEMPTS@"
  dir="$dir/${SLURM_ARRAY_JOB_ID:-${SLURM_JOB_ID:-0}}_${SLURM_ARRAY_TASK_ID:-0}"
  dir="$dir.r${SLURM_RESTART_COUNT:-0}"
  tmp="$dir/.@STREAM@-$$.tmp"
  t=$(date +%s)
  mkdir -p "$dir" && printf '{"type": "exit", "time": %s, "code": %s, "reason": "setup",'\
' "signal": null, "step": null, "checkpoint_step": null}\n{"type": "log", "time": %s,'\
' "level": "error", "message": "%s"}\n' "$t" "$code" "$t" "$_dlhpc_msg" > "$tmp" \
    && mv -f "$tmp" "$dir/@STREAM@-00000000.jsonl"
}""".replace("@ATTEMPTS@", ATTEMPTS_DIR).replace("@STREAM@", SETUP_STREAM)


def _json_text(text: str) -> str:
    """``text`` as the inside of a JSON string (quotes, backslashes, controls escaped)."""
    return json.dumps(text)[1:-1]


def setup_section(sections: Sequence[tuple[str, Sequence[str]]], python: str) -> list[str]:
    """The job script's lines before the worker starts (see the module docstring), for
    a task whose trial folder the script has in ``_dlhpc_trial`` and whose worker runs
    ``python`` (a shell word as the command line will hold it: already quoted). []
    when there are no setup lines."""
    if not any(lines for _, lines in sections):
        return []
    run: list[str] = []
    described: list[str] = []
    for label, lines in sections:
        for i, line in enumerate(lines, 1):
            run.append(line)
            shown = " ".join(line.split())
            described.append(_json_text(f"{label} line {i}: {shown}"[:300]))
    run.append(f"{python} -c {shlex.quote(_CHECK)}")
    described.append(_json_text(f"the worker's Python {python} cannot start or import dlhpc"))
    head = [
        "# dlhpc: the job's environment, set up before the worker's Python starts; a failing",
        "# line fails the attempt (set -e), its reason written to the attempt's folder",
        "_dlhpc_lines=(" + " ".join(shlex.quote(d) for d in described) + ")",
        *_FAILED_FN.splitlines(),
    ]
    folder = os.path.dirname(shlex.split(python)[0]) if python else ""
    if folder and os.path.isabs(folder):
        head.append(f'export PATH={shlex.quote(folder)}:"$PATH"')
    if any(_USES_MODULE.match(line) for line in run):
        head += _MODULE_INIT
    head += [
        "trap '_dlhpc_err_line=$LINENO' ERR",
        "trap '_dlhpc_setup_failed' EXIT",
        "set -e",
        "_dlhpc_base=$LINENO",
    ]
    tail = ["set +e", "trap - EXIT ERR", f"export {SETUP_DONE_VAR}=done"]
    return [*head, *run, *tail]
