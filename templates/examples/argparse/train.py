"""Train a small MLP on scikit-learn's bundled 8x8 digits: an ordinary argparse script.

It knows nothing of dlhpc. It reads its settings from the command line, prints one
line per epoch with its losses and accuracy, saves a checkpoint per epoch into
--ckpt-dir (written under a temporary name, then renamed) and resumes from --resume.
Every epoch's data order and dropout come from --seed and the epoch, so a run resumed
from a checkpoint ends with the same weights as one that never stopped.

    python train.py --lr 0.01 --epochs 5
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ckpt-dir", default="checkpoints")
    p.add_argument("--resume", default="", help="a checkpoint file to continue from")
    p.add_argument("--step-sleep", type=float, default=0.0, help="slow steps down (demos)")
    return p.parse_args()


def load_data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    x, y = load_digits(return_X_y=True)
    x_train, x_val, y_train, y_val = train_test_split(
        x / 16.0, y, test_size=0.2, random_state=0, stratify=y
    )
    return (
        torch.tensor(x_train, dtype=torch.float32),
        torch.tensor(y_train, dtype=torch.long),
        torch.tensor(x_val, dtype=torch.float32),
        torch.tensor(y_val, dtype=torch.long),
    )


def weights_sha256(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()


def main() -> None:
    args = parse_args()
    torch.manual_seed(args.seed)
    x_train, y_train, x_val, y_val = load_data()
    model = nn.Sequential(
        nn.Linear(x_train.shape[1], args.hidden),
        nn.ReLU(),
        nn.Dropout(args.dropout),
        nn.Linear(args.hidden, 10),
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()
    start = 0
    if args.resume:
        saved = torch.load(args.resume)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        start = saved["epoch"]
        print(f"resumed at epoch {start} from {args.resume}", flush=True)
    os.makedirs(args.ckpt_dir, exist_ok=True)

    for epoch in range(start + 1, args.epochs + 1):
        torch.manual_seed(args.seed * 10_007 + epoch)  # this epoch's order and dropout
        model.train()
        total = 0.0
        for idx in torch.split(torch.randperm(len(x_train)), args.batch_size):
            optimizer.zero_grad()
            loss = loss_fn(model(x_train[idx]), y_train[idx])
            loss.backward()
            optimizer.step()
            total += loss.item() * len(idx)
            time.sleep(args.step_sleep)
        model.eval()
        with torch.no_grad():
            logits = model(x_val)
            val_loss = loss_fn(logits, y_val).item()
            val_accuracy = (logits.argmax(1) == y_val).float().mean().item()
        print(
            f"epoch {epoch} train_loss={total / len(x_train):.6f} val_loss={val_loss:.6f}"
            f" val_accuracy={val_accuracy:.6f}",
            flush=True,
        )
        print(f"epoch {epoch} weights sha256 {weights_sha256(model)}", flush=True)
        tmp = os.path.join(args.ckpt_dir, f".epoch-{epoch}.pt.tmp")
        state = {"epoch": epoch, "model": model.state_dict(), "optimizer": optimizer.state_dict()}
        torch.save(state, tmp)
        os.replace(tmp, os.path.join(args.ckpt_dir, f"epoch-{epoch}.pt"))


if __name__ == "__main__":
    main()
