"""Train a small MLP on scikit-learn's bundled 8x8 digits (no download).

Inside a dlhpc job the hyperparameters, the number of epochs (``max_length``)
and the seed come from the trial; run by hand (``python train.py``) it uses
DEFAULTS. Reports train_loss, val_loss and val_accuracy after every epoch.
"""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

import dlhpc

# Used only outside a dlhpc job; inside one, trial.json wins.
DEFAULTS: dict[str, Any] = {
    "lr": 1e-2,
    "hidden": 64,
    "dropout": 0.1,
    "batch_size": 64,
    "max_length": 5,  # epochs
}
SPLIT_SEED = 0  # the same train/val split for every trial, so their metrics compare


def load_data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    x, y = load_digits(return_X_y=True)
    x_train, x_val, y_train, y_val = train_test_split(
        x / 16.0, y, test_size=0.2, random_state=SPLIT_SEED, stratify=y
    )
    return (
        torch.tensor(x_train, dtype=torch.float32),
        torch.tensor(y_train, dtype=torch.long),
        torch.tensor(x_val, dtype=torch.float32),
        torch.tensor(y_val, dtype=torch.long),
    )


def seed_everything(seed: int) -> torch.Generator:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def main() -> None:
    torch.set_num_threads(int(os.environ.get("SLURM_CPUS_PER_TASK", "1")))
    with dlhpc.init(local_hparams=DEFAULTS) as ctx:
        hp = ctx.hparams
        lr, hidden = float(hp["lr"]), int(hp["hidden"])
        dropout, batch_size = float(hp["dropout"]), int(hp["batch_size"])
        gen = seed_everything(ctx.seed)
        x_train, y_train, x_val, y_val = load_data()

        model = nn.Sequential(
            nn.Linear(x_train.shape[1], hidden),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, 10),
        )
        optimizer = torch.optim.Adam(model.parameters(), lr=lr)
        loss_fn = nn.CrossEntropyLoss()

        val_accuracy = float("nan")
        for epoch in range(1, ctx.max_length + 1):
            model.train()
            total_loss = 0.0
            for idx in torch.split(torch.randperm(len(x_train), generator=gen), batch_size):
                optimizer.zero_grad()
                loss = loss_fn(model(x_train[idx]), y_train[idx])
                loss.backward()
                optimizer.step()
                total_loss += loss.item() * len(idx)

            model.eval()
            with torch.no_grad():
                logits = model(x_val)
                val_loss = loss_fn(logits, y_val).item()
                val_accuracy = (logits.argmax(dim=1) == y_val).float().mean().item()
            train_loss = total_loss / len(x_train)
            ctx.report(
                epoch,
                {"train_loss": train_loss, "val_loss": val_loss, "val_accuracy": val_accuracy},
            )
            print(
                f"epoch {epoch}/{ctx.max_length} train_loss={train_loss:.4f} "
                f"val_loss={val_loss:.4f} val_accuracy={val_accuracy:.4f}",
                flush=True,
            )
        print(f"final val_accuracy={val_accuracy:.4f}", flush=True)


if __name__ == "__main__":
    main()
