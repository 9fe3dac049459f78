#!/usr/bin/env python3
"""Trainer of ``bench_fault.py lost``: the digits example's loop, or a big MLP.

Runs inside a (fake or real) dlhpc trial: ``dlhpc.init()`` reads ``trial.json``. The loop is
the one of ``templates/examples/digits/train.py`` (same data, split, model and epoch order for
``model: digits``; its ``load_data`` is imported from there), with two bench switches in the
hyperparameters:

* ``stop_checkpoint`` (default true): ``ctx.step(state)`` as the example does, so a stop
  signal checkpoints the current step before the exit. False: ``ctx.step(None)``, which exits
  for requeue *without* a checkpoint: the baseline of a script that checkpoints only at epoch
  ends (what it trained since the last epoch end is lost).
* ``model: synthetic``: an MLP ``in_dim -> width x depth -> 10`` (defaults: 1024, 4096, 3:
  37.8 M parameters, a 454 MB checkpoint with Adam's state) on seeded random batches,
  ``steps_per_epoch`` steps an epoch.

Bench-only controls come from the environment, not the hyperparameters:
``BENCH_FAULT_LOG`` (a JSON-lines timing log: one record per step, checkpoint, restore),
``BENCH_FAULT_EXIT_AFTER`` (exit 0 after this many steps, without a checkpoint: a resumed run
that only has to show its first step).
"""

from __future__ import annotations

import time

T_START = time.time()  # before the heavy imports

import atexit  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, TextIO  # noqa: E402

import torch  # noqa: E402
from torch import nn  # noqa: E402

import dlhpc  # noqa: E402

DIGITS_TRAIN = (
    Path(__file__).resolve().parents[3] / "templates" / "examples" / "digits" / "train.py"
)


class Log:
    def __init__(self, path: str | None) -> None:
        self.f: TextIO | None = open(path, "a", buffering=1) if path else None  # noqa: SIM115

    def __call__(self, ev: str, **fields: Any) -> None:
        if self.f is not None:
            self.f.write(
                json.dumps({"ev": ev, "t": time.time(), "pid": os.getpid(), **fields}) + "\n"
            )


def _digits_module() -> Any:
    spec = importlib.util.spec_from_file_location("digits_train", DIGITS_TRAIN)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> int:
    log = Log(os.environ.get("BENCH_FAULT_LOG"))
    exit_after = int(os.environ.get("BENCH_FAULT_EXIT_AFTER", "0"))
    log("start", t_start=T_START)
    atexit.register(log, "atexit_last")  # registered first: runs after dlhpc's flush at exit
    torch.set_num_threads(int(os.environ.get("SLURM_CPUS_PER_TASK", "1")))
    ctx = dlhpc.init()
    hp = ctx.hparams
    kind = str(hp.get("model", "digits"))
    stop_ckpt = bool(hp.get("stop_checkpoint", True))
    step_sleep = float(hp.get("step_sleep", 0.0))
    batch_size = int(hp.get("batch_size", 64))
    torch.manual_seed(ctx.seed)

    if kind == "digits":
        digits = _digits_module()
        digits.seed_everything(ctx.seed)
        x_train, y_train, x_val, y_val = digits.load_data()
        hidden = int(hp.get("hidden", 64))
        model = nn.Sequential(
            nn.Linear(x_train.shape[1], hidden),
            nn.ReLU(),
            nn.Dropout(float(hp.get("dropout", 0.1))),
            nn.Linear(hidden, 10),
        )
        lr = float(hp.get("lr", 1e-2))
        steps_per_epoch = (len(x_train) + batch_size - 1) // batch_size
    else:
        width, depth = int(hp["width"]), int(hp["depth"])
        in_dim = int(hp["in_dim"])
        layers: list[nn.Module] = [nn.Linear(in_dim, width), nn.ReLU()]
        for _ in range(depth - 1):
            layers += [nn.Linear(width, width), nn.ReLU()]
        model = nn.Sequential(*layers, nn.Linear(width, 10))
        lr = float(hp.get("lr", 1e-4))
        steps_per_epoch = int(hp["steps_per_epoch"])
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    n_params = sum(p.numel() for p in model.parameters())

    state = ctx.train_state(model=model, optimizer=optimizer)
    plain_save = state.save

    def timed_save() -> Any:
        t0 = time.time()
        ckpt = plain_save()
        log(
            "ckpt",
            t0=t0,
            t1=time.time(),
            step=state.step,
            epoch=state.epoch,
            batch=state.batch,
            bytes=ckpt.size_bytes if ckpt is not None else None,
            stop=in_stop,  # the checkpoint of ctx.step() at a stop signal
        )
        return ckpt

    in_stop = False
    state.save = timed_save  # type: ignore[method-assign]
    log("setup", params=n_params, steps_per_epoch=steps_per_epoch)
    t0 = time.time()
    restored = state.restore()
    log(
        "restore",
        t0=t0,
        t1=time.time(),
        restored=restored,
        step=state.step,
        bytes=state.restored_from.size_bytes if state.restored_from else None,
    )

    trained_here = 0
    last_loss = float("nan")  # a resume at an epoch's end trains no step before the report
    while state.epoch < ctx.max_length:
        model.train()
        if kind == "digits":  # the example's epoch order
            order = torch.randperm(
                len(x_train),
                generator=torch.Generator().manual_seed(ctx.seed * 10_007 + state.epoch),
            )
            batches: Any = torch.split(order, batch_size)
        else:
            batches = range(steps_per_epoch)
        for i, idx in enumerate(batches):
            if i < state.batch:
                continue
            optimizer.zero_grad()
            if kind == "digits":
                x, y = x_train[idx], y_train[idx]
            else:
                g = torch.Generator().manual_seed(state.step)
                x = torch.randn(batch_size, in_dim, generator=g)
                y = torch.randint(0, 10, (batch_size,), generator=g)
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            last_loss = loss.item()
            state.batch, state.step = i + 1, state.step + 1
            if step_sleep:
                time.sleep(step_sleep)
            trained_here += 1
            log("step", step=state.step, epoch=state.epoch)
            if ctx.should_stop():
                log("stop_seen", step=state.step, reason=ctx.stop_reason)
                in_stop = True
            if exit_after and trained_here >= exit_after:
                ctx.close()
                return 0
            # the harness (checkpoint, then exit 75) or the baseline (exit 75, no checkpoint)
            ctx.step(state if stop_ckpt else None)
        metrics = {"train_loss": last_loss}
        if kind == "digits":  # the example's end-of-epoch validation
            model.eval()
            with torch.no_grad():
                logits = model(x_val)
                metrics["val_loss"] = loss_fn(logits, y_val).item()
                metrics["val_accuracy"] = (logits.argmax(dim=1) == y_val).float().mean().item()
        state.epoch, state.batch = state.epoch + 1, 0
        ctx.report(state.epoch, metrics)
        ctx.checkpoint(state)
    ctx.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
