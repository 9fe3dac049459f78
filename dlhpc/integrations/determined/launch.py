"""The stand-in's launch layers: ``python3 -m determined.launch.torch_distributed SCRIPT...``,
``python3 -m determined.launch.deepspeed SCRIPT...`` and
``python3 -m determined.launch.wrap_rank RANK [--] SCRIPT...``.

Determined runs the entrypoint once per container (node); its launch layers start one
worker per slot there, through torchrun or DeepSpeed's launcher, each worker wrapped by
``wrap_rank`` (which prefixes its output lines with ``[rank=N]``). Here the entrypoint
is one dlhpc task per node (:mod:`~dlhpc.integrations.determined.cluster`) and the
launch layer starts the workers itself, with the variables torchrun and DeepSpeed's
launcher set (:func:`worker_envs`), derived from the container layout and dlhpc's
rank environment (:mod:`dlhpc.harness.distributed`: ``MASTER_ADDR`` is the first
node's address, ``MASTER_PORT`` the job's port).

The launch layer forwards the signals it gets (preemption's TERM, the time limit's USR2)
to its workers and waits for them. When one fails (an exit code other than 0 and
dlhpc's requeue code) the others get TERM, and KILL :data:`KILL_AFTER_S` later; the
launch layer exits with that failure's code, else with the requeue code if a worker
exited with it, else 0. Usage errors (Determined's ``--trial``, torchrun overrides, no
script, no slots) exit 2 with a one-line reason.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from types import FrameType
from typing import IO

from dlhpc.errors import DlhpcError
from dlhpc.harness.distributed import single_process_env
from dlhpc.integrations.determined.cluster import (
    ENV_CONTAINER_ADDRS,
    ENV_CONTAINER_RANK,
    container_layout,
    slots_per_container,
)
from dlhpc.protocol import REQUEUE_EXIT_CODE

__all__ = [
    "KILL_AFTER_S",
    "deepspeed_main",
    "run_workers",
    "torch_distributed_main",
    "worker_envs",
    "wrap_rank_main",
]

KILL_AFTER_S = 30.0
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)
# the variable each Determined launch layer sets for the training code
_FRAMEWORK_VARS = {"torch": {"USE_TORCH_DISTRIBUTED": "True"}, "deepspeed": {"USE_DEEPSPEED": "1"}}


def worker_envs(environ: Mapping[str, str], framework: str) -> list[dict[str, str]]:
    """The variables of each worker of this container, local rank order: torchrun's
    (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``,
    ``GROUP_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), DeepSpeed's (``LOCAL_SIZE``,
    ``CROSS_RANK``, ``CROSS_SIZE``), Determined's (``DET_CHIEF_IP`` and
    ``USE_TORCH_DISTRIBUTED`` or ``USE_DEEPSPEED``) and the container's layout for
    ``get_cluster_info()``. One container: ``MASTER_ADDR`` is ``127.0.0.1`` (Determined's
    ``localhost``), and without a job's ``MASTER_PORT`` a port free now. ``framework``:
    ``torch`` or ``deepspeed``. Raises DlhpcError without slots, or with several
    containers and no ``MASTER_PORT``."""
    slots = slots_per_container(environ)
    if slots < 1:
        raise DlhpcError("a launch layer needs at least one slot (resources.slots_per_trial)")
    rank, addrs = container_layout(environ)
    port = environ.get("MASTER_PORT", "")
    if not port and len(addrs) == 1:  # a lone task outside Slurm (the local backend)
        port = single_process_env(environ)["MASTER_PORT"]
    if not port.isdigit():
        raise DlhpcError(f"MASTER_PORT must be the job's rendezvous port, got {port!r}")
    common = {
        "WORLD_SIZE": str(len(addrs) * slots),
        "LOCAL_WORLD_SIZE": str(slots),
        "LOCAL_SIZE": str(slots),
        "GROUP_RANK": str(rank),
        "CROSS_RANK": str(rank),
        "GROUP_WORLD_SIZE": str(len(addrs)),
        "CROSS_SIZE": str(len(addrs)),
        "MASTER_ADDR": addrs[0] if len(addrs) > 1 else "127.0.0.1",
        "MASTER_PORT": port,
        "DET_CHIEF_IP": addrs[0],
        ENV_CONTAINER_RANK: str(rank),
        ENV_CONTAINER_ADDRS: json.dumps(addrs),
        **_FRAMEWORK_VARS[framework],
    }
    return [
        {**common, "RANK": str(rank * slots + local), "LOCAL_RANK": str(local)}
        for local in range(slots)
    ]


def _exit_code(code: int) -> int:
    return 128 - code if code < 0 else code


def _forward_signals(procs: list[subprocess.Popen[bytes]]) -> None:
    """Pass the signals this process gets on to ``procs`` (still running)."""

    def forward(signum: int, _frame: FrameType | None) -> None:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signum)

    for sig in _FORWARDED:
        signal.signal(sig, forward)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """TERM each running process, KILL those still running :data:`KILL_AFTER_S` later."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + KILL_AFTER_S
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_workers(script: list[str], envs: list[dict[str, str]]) -> int:
    """Run ``script`` once per entry of ``envs`` (added to this environment), each under
    ``wrap_rank``; returns the exit code described in the module's doc."""
    procs: list[subprocess.Popen[bytes]] = []
    _forward_signals(procs)
    for env in envs:
        argv = [sys.executable, "-m", "determined.launch.wrap_rank", env["RANK"], "--", *script]
        procs.append(subprocess.Popen(argv, env={**os.environ, **env}))
    running, failed, requeue = list(procs), 0, False
    while running:
        for proc in [p for p in running if p.poll() is not None]:
            running.remove(proc)
            code = _exit_code(proc.returncode)
            requeue = requeue or code == REQUEUE_EXIT_CODE
            if code not in (0, REQUEUE_EXIT_CODE) and not failed:
                failed = code
                _stop(running)
        time.sleep(0.05)
    return failed or (REQUEUE_EXIT_CODE if requeue else 0)


def _script(name: str, args: list[str], overrides_allowed: bool) -> list[str]:
    """The worker command of ``args``; DlhpcError for what the stand-in does not run."""
    if "--" in args and overrides_allowed:
        split = args.index("--")
        if args[:split]:
            raise DlhpcError(
                f"torch.distributed.run overrides {args[:split]} are not supported:"
                " dlhpc sets the nodes, processes per node, ranks and rendezvous itself"
            )
        args = args[split + 1 :]
    if args[:1] == ["--trial"] or any(a.startswith("--trial=") for a in args[:1]):
        raise DlhpcError(
            "--trial (a Trial API class) is not supported: dlhpc runs Core API"
            " scripts (det.core.init(); see `dlhpc convert determined`)"
        )
    if not args:
        raise DlhpcError(f"no script (usage: python3 -m {name} SCRIPT...)")
    return args


def _launch(name: str, framework: str, argv: list[str]) -> int:
    try:
        script = _script(name, argv, overrides_allowed=framework == "torch")
        envs = worker_envs(os.environ, framework)
    except DlhpcError as err:
        print(f"{name}: {err}", file=sys.stderr)
        return 2
    return run_workers(script, envs)


def torch_distributed_main(argv: list[str]) -> int:
    """``python3 -m determined.launch.torch_distributed [--] SCRIPT...``"""
    return _launch("determined.launch.torch_distributed", "torch", argv)


def deepspeed_main(argv: list[str]) -> int:
    """``python3 -m determined.launch.deepspeed SCRIPT...``"""
    return _launch("determined.launch.deepspeed", "deepspeed", argv)


def _rank_of(arg: str, environ: Mapping[str, str]) -> int:
    """``RANK`` as Determined's wrap_rank reads it: a number, or variable names to try."""
    if arg.isdigit():
        return int(arg)
    for name in arg.split(","):
        if environ.get(name, "").isdigit():
            return int(environ[name])
    raise DlhpcError(f"rank environment variable is set to {arg}, but it is not in os.environ")


def _prefix(src: IO[bytes], dst: IO[bytes], rank: int) -> None:
    for line in iter(src.readline, b""):
        dst.write(f"[rank={rank}] ".encode() + (line if line.endswith(b"\n") else line + b"\n"))
        dst.flush()


def wrap_rank_main(argv: list[str]) -> int:
    """``python3 -m determined.launch.wrap_rank [--no-redirect-stdio] RANK [--] SCRIPT...``:
    run SCRIPT with each line of its output prefixed by ``[rank=RANK] ``; exits with its
    code (128+n for signal n)."""
    args = argv[1:] if argv[:1] == ["--no-redirect-stdio"] else list(argv)
    script = args[2:] if args[1:2] == ["--"] else args[1:]
    if not args or not script:
        print("usage: wrap_rank.py [--no-redirect-stdio] RANK SCRIPT...", file=sys.stderr)
        return 2
    try:
        rank = _rank_of(args[0], os.environ)
    except DlhpcError as err:
        print(err, file=sys.stderr)
        return 1
    proc = subprocess.Popen(script, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _forward_signals([proc])
    assert proc.stdout is not None and proc.stderr is not None  # both are pipes
    threads = [
        threading.Thread(target=_prefix, args=(proc.stdout, sys.stdout.buffer, rank)),
        threading.Thread(target=_prefix, args=(proc.stderr, sys.stderr.buffer, rank)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return _exit_code(proc.wait())
