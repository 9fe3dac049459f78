"""One rank of the DeepSpeed checkpoint tests (run by tests/unit/test_deepspeed.py).

argv: a JSON object: ckpt (folder), out (folder), stage (ZeRO), steps (train up to),
save_at (steps after which to save), crash_at (a step whose save is SIGKILLed in its
staging folder, on every rank), roundtrip (then build a second engine in this
process, restore the newest checkpoint into it and train it to ``steps`` too).
Writes out/rank-<r>.json: per run, the step it started from, the losses by step,
the world size and a weight checksum. :func:`spawn` starts the ranks (the unit tests
and scripts/bench/ds_gpu/ds_exit_race.py).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from dlhpc.harness import deepspeed as dsh

REPO = Path(__file__).resolve().parents[2]
MODULE = ("-m", "tests.unit._ds_rank")


def spawn(
    n: int,
    args: dict[str, Any],
    *,
    cwd: Path = REPO,
    env: Mapping[str, str] | None = None,
    launcher: Sequence[str] = MODULE,
) -> list[subprocess.Popen[str]]:
    """Start ``n`` ranks (gloo on localhost, a free port): ``python *launcher ARGS``
    with ``args`` as JSON, Slurm and dlhpc variables dropped, ``env`` added; stdout
    discarded, stderr piped (text). The caller waits on them."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "DLHPC_"))}
    base |= {"WORLD_SIZE": str(n), "LOCAL_WORLD_SIZE": str(n), "MASTER_ADDR": "127.0.0.1"}
    base |= {"MASTER_PORT": str(port), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    base |= env or {}
    return [
        subprocess.Popen(
            [sys.executable, *launcher, json.dumps(args)],
            cwd=cwd,
            env={**base, "RANK": str(r), "LOCAL_RANK": str(r)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(n)
    ]


def run(args: dict[str, Any]) -> dict[str, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(32, 1)
    )
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
        "zero_optimization": {"stage": args["stage"]},
        "steps_per_print": 10**9,
    }
    engine = dsh.build_engine(None, model, config=config)
    data = torch.Generator()
    state = dsh.EngineState(engine, Path(args["ckpt"]), generators={"data": data}, keep_latest=2)
    if not state.restore() or state.resharded:
        torch.manual_seed(100 + state.rank)
        data.manual_seed(1000 + state.rank)
    start = state.step
    losses = {}
    while state.step < args["steps"]:
        x = torch.randn(4, 8, generator=data)
        loss = torch.nn.functional.mse_loss(engine(x), x.sum(1, keepdim=True))
        engine.backward(loss)
        engine.step()
        state.step += 1
        losses[state.step] = loss.item()
        if state.step == args.get("crash_at"):
            os.environ["DLHPC_FAILPOINTS"] = "ds-ckpt-staged"
        if state.step in args["save_at"] or state.step == args.get("crash_at"):
            state.save()
    with torch.no_grad():
        checksum = sum(float(p.double().sum()) for p in engine.module.parameters())
    return {"start": start, "losses": losses, "world": state.world_size, "checksum": checksum}


def main() -> None:
    args = json.loads(sys.argv[1])
    out = {"first": run(args)}
    if args.get("roundtrip"):
        out["second"] = run({**args, "save_at": []})
    Path(args["out"], f"rank-{os.environ['RANK']}.json").write_text(json.dumps(out))


if __name__ == "__main__":
    main()
