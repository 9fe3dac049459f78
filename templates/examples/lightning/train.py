"""Train a small MLP on scikit-learn's bundled 8x8 digits with PyTorch Lightning.

``train_plain.py`` is the script before dlhpc; ``train.py`` is the same script with
the lines dlhpc needs (``diff train_plain.py train.py``; see README.md).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import lightning as L
import torch
from dlhpc.integrations.lightning import DlhpcCallback, hparams
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class DigitsData(L.LightningDataModule):
    def __init__(self, batch_size: int) -> None:
        super().__init__()
        self.batch_size = batch_size

    def setup(self, stage: str) -> None:
        x, y = load_digits(return_X_y=True)
        x_train, x_val, y_train, y_val = train_test_split(
            x / 16.0, y, test_size=0.2, random_state=0, stratify=y
        )
        self.train = TensorDataset(torch.tensor(x_train).float(), torch.tensor(y_train))
        self.val = TensorDataset(torch.tensor(x_val).float(), torch.tensor(y_val))

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.train, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.val, batch_size=256)


class DigitsModel(L.LightningModule):
    def __init__(self, lr: float, hidden: int, dropout: float, step_sleep: float = 0.0) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Linear(64, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, 10)
        )

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, on_step=False, on_epoch=True)
        time.sleep(self.hparams.step_sleep)  # slows steps down, for preemption demos
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        logits = self.net(x)
        self.log("val_loss", nn.functional.cross_entropy(logits, y))
        self.log("val_accuracy", (logits.argmax(dim=1) == y).float().mean())

    def configure_optimizers(self) -> Any:
        opt = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 3, 0.5)}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--step-sleep", type=float, default=0.0)
    return p.parse_args()


def main() -> None:
    args = hparams(parse_args())
    torch.set_num_threads(1)
    L.seed_everything(args.seed)
    model = DigitsModel(args.lr, args.hidden, args.dropout, args.step_sleep)
    trainer = L.Trainer(
        max_epochs=args.epochs,
        accelerator="cpu",
        deterministic=True,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[DlhpcCallback()],
    )
    trainer.fit(model, DigitsData(args.batch_size))


if __name__ == "__main__":
    main()
