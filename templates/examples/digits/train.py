"""Train a small MLP on scikit-learn's bundled 8x8 digits (no download).

Inside a dlhpc job the hyperparameters, the number of epochs (``max_length``)
and the seed come from the trial; run by hand (``python train.py``) it uses
DEFAULTS. Reports train_loss, val_loss and val_accuracy after every epoch and
checkpoints the full training state then; when the job is preempted or reaches
its time limit it checkpoints mid-epoch and exits, and the next attempt resumes
exactly where it stopped (bitwise, with ``reproducibility.deterministic``).
"""

from __future__ import annotations

import hashlib
import os
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

import dlhpc
from dlhpc.harness.state import TrainState

# Used only outside a dlhpc job; inside one, trial.json wins.
DEFAULTS: dict[str, Any] = {
    "lr": 1e-2,
    "hidden": 64,
    "dropout": 0.1,
    "batch_size": 64,
    "max_length": 5,  # epochs
}
SPLIT_SEED = 0  # the same train/val split for every trial, so their metrics compare


# The split, made once from scikit-learn's digits and kept here: every trial is a
# process of its own, and importing scikit-learn takes about a second of CPU.
DATA_CACHE = (
    Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    / "dlhpc-examples"
    / f"digits-split-{SPLIT_SEED}.npz"
)
SPLIT_NAMES = ("x_train", "y_train", "x_val", "y_val")


def split_digits() -> dict[str, np.ndarray]:
    """The train/val split of the digits: float32 features in [0, 1], int64 labels."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x_train, x_val, y_train, y_val = train_test_split(
        x / 16.0, y, test_size=0.2, random_state=SPLIT_SEED, stratify=y
    )
    arrays = {"x_train": x_train, "y_train": y_train, "x_val": x_val, "y_val": y_val}
    return {k: v.astype(np.float32 if k[0] == "x" else np.int64) for k, v in arrays.items()}


def load_data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The split from DATA_CACHE, made and saved there first if it is not yet (written
    to a temporary file and renamed, so that trials starting together never read a
    half-written one; where the cache cannot be written, the split is used unsaved)."""
    if DATA_CACHE.exists():
        with np.load(DATA_CACHE) as cached:
            arrays = {k: cached[k] for k in SPLIT_NAMES}
    else:
        arrays = split_digits()
        tmp = DATA_CACHE.with_name(f".{DATA_CACHE.name}.{os.getpid()}.npz")
        try:
            DATA_CACHE.parent.mkdir(parents=True, exist_ok=True)
            np.savez(
                tmp,
                x_train=arrays["x_train"],
                y_train=arrays["y_train"],
                x_val=arrays["x_val"],
                y_val=arrays["y_val"],
            )
            os.replace(tmp, DATA_CACHE)
        except OSError as err:
            tmp.unlink(missing_ok=True)
            print(f"note: the data split is not cached ({err})", flush=True)
    x_train, y_train, x_val, y_val = (torch.from_numpy(arrays[k]) for k in SPLIT_NAMES)
    return x_train, y_train, x_val, y_val


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def weights_sha256(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def main() -> None:
    torch.set_num_threads(int(os.environ.get("SLURM_CPUS_PER_TASK", "1")))
    ctx = dlhpc.init(local_hparams=DEFAULTS)
    if ctx.deterministic:
        torch.use_deterministic_algorithms(True)
    hp = ctx.hparams
    lr, hidden = float(hp["lr"]), int(hp["hidden"])
    dropout, batch_size = float(hp["dropout"]), int(hp["batch_size"])
    step_sleep = float(hp.get("step_sleep", 0.0))  # slows steps down, for preemption demos
    seed_everything(ctx.seed)
    x_train, y_train, x_val, y_val = load_data()

    model = nn.Sequential(
        nn.Linear(x_train.shape[1], hidden),
        nn.ReLU(),
        nn.Dropout(dropout),
        nn.Linear(hidden, 10),
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()

    # The full training state: weights, optimizer, RNGs, position, extras.
    if ctx.checkpoint_dir is not None:
        state = ctx.train_state(model=model, optimizer=optimizer)
    else:  # a run by hand keeps its checkpoints here
        state = TrainState(Path("checkpoints-local"), model=model, optimizer=optimizer)
    if state.restore():
        print(f"resumed at epoch {state.epoch}, batch {state.batch}, step {state.step}", flush=True)

    val_accuracy = float("nan")
    while state.epoch < ctx.max_length:
        model.train()
        # The epoch's order depends on the seed and epoch only, so a resumed epoch
        # replays it and skips the batches already trained.
        order = torch.randperm(
            len(x_train), generator=torch.Generator().manual_seed(ctx.seed * 10_007 + state.epoch)
        )
        if state.batch == 0:
            state.extras["loss_sum"] = 0.0
        for i, idx in enumerate(torch.split(order, batch_size)):
            if i < state.batch:
                continue
            optimizer.zero_grad()
            loss = loss_fn(model(x_train[idx]), y_train[idx])
            loss.backward()
            optimizer.step()
            state.extras["loss_sum"] += loss.item() * len(idx)
            state.batch, state.step = i + 1, state.step + 1
            if step_sleep:
                time.sleep(step_sleep)
            ctx.step(state)  # on preemption: checkpoint here and exit for requeue

        model.eval()
        with torch.no_grad():
            logits = model(x_val)
            val_loss = loss_fn(logits, y_val).item()
            val_accuracy = (logits.argmax(dim=1) == y_val).float().mean().item()
        train_loss = state.extras["loss_sum"] / len(x_train)
        state.epoch, state.batch = state.epoch + 1, 0
        ctx.report(
            state.epoch,
            {"train_loss": train_loss, "val_loss": val_loss, "val_accuracy": val_accuracy},
        )
        ctx.checkpoint(state)
        print(
            f"epoch {state.epoch}/{ctx.max_length} train_loss={train_loss:.4f} "
            f"val_loss={val_loss:.4f} val_accuracy={val_accuracy:.4f}",
            flush=True,
        )
    sha = weights_sha256(model)
    if ctx.checkpoint_dir is not None:
        (ctx.checkpoint_dir / "final_weights.sha256").write_text(sha + "\n")
    print(f"final val_accuracy={val_accuracy:.4f} weights_sha256={sha}", flush=True)
    ctx.close()


if __name__ == "__main__":
    main()
