"""Trainer of ``bench_search.py``: the digits MLP, memoized per (hyperparameters, seed).

The model, data, split, optimizer, loss and epoch order are those of
``templates/examples/digits/train.py``; the only difference is that a trainer
keeps its own copy of torch's RNG (dropout), so several trainers can be
interleaved in one process and each still gives the curve it would give alone.
A trainer's curve is a pure function of (hyperparameters, seed): training a
config to 9 epochs, pausing and going on to 27 gives the first 27 points of the
curve of a straight 27-epoch run, which is what dlhpc's checkpoints guarantee.

:class:`CurveCache` computes curves lazily, one epoch at a time, and keeps them
(validation accuracy and CPU seconds per epoch) in a JSON file, so reruns are
fast. A curve cached to ``k`` epochs that must grow is replayed from scratch
(not charged to anyone) and the replay is checked against the cache.
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

Data = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
EXAMPLE = Path(__file__).resolve().parents[3] / "templates/examples/digits/train.py"


def load_data() -> Data:
    """The example's own ``load_data`` (same data, split and scaling)."""
    spec = importlib.util.spec_from_file_location("_digits_example", EXAMPLE)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {EXAMPLE}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.load_data()  # type: ignore[no-any-return]


class DigitsTrainer:
    """One config being trained, epoch by epoch, with its own RNG state."""

    def __init__(self, data: Data, hp: dict[str, Any], seed: int) -> None:
        self.data, self.seed, self.epoch = data, seed, 0
        self.batch_size = int(hp["batch_size"])
        torch.manual_seed(seed)
        hidden = int(hp["hidden"])
        self.model = nn.Sequential(
            nn.Linear(data[0].shape[1], hidden),
            nn.ReLU(),
            nn.Dropout(float(hp["dropout"])),
            nn.Linear(hidden, 10),
        )
        self.optimizer = torch.optim.Adam(
            self.model.parameters(),
            lr=float(hp["lr"]),
            weight_decay=float(hp.get("weight_decay", 0.0)),
        )
        self.rng = torch.get_rng_state()
        self.loss_fn = nn.CrossEntropyLoss()

    def train_epoch(self) -> tuple[float, float]:
        """Train one more epoch; (validation accuracy, CPU seconds of the epoch)."""
        x_train, y_train, x_val, y_val = self.data
        t0 = time.process_time()
        torch.set_rng_state(self.rng)
        self.model.train()
        order = torch.randperm(
            len(x_train), generator=torch.Generator().manual_seed(self.seed * 10_007 + self.epoch)
        )
        for idx in torch.split(order, self.batch_size):
            self.optimizer.zero_grad()
            loss = self.loss_fn(self.model(x_train[idx]), y_train[idx])
            loss.backward()
            self.optimizer.step()
        self.model.eval()
        with torch.no_grad():
            logits = self.model(x_val)
        acc = (logits.argmax(dim=1) == y_val).float().mean().item()
        if acc != acc:  # NaN (a diverged model) counts as chance-free zero
            acc = 0.0
        self.rng = torch.get_rng_state()
        self.epoch += 1
        return acc, time.process_time() - t0


def config_key(hp: dict[str, Any], seed: int) -> str:
    return json.dumps({"hp": hp, "seed": seed}, sort_keys=True)


class CurveCache:
    """Curves (val_accuracy and CPU seconds per epoch) per (hyperparameters, seed)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.curves: dict[str, dict[str, list[float]]] = {}
        if path is not None and path.exists():
            stored = json.loads(path.read_text())
            if stored.get("torch") == torch.__version__:  # another torch may give other curves
                self.curves = stored["curves"]
        self.data = load_data()
        self.live: dict[str, DigitsTrainer] = {}
        self.epochs_trained = 0  # real epochs this process trained (replays included)
        self.replay_mismatches = 0

    def point(self, hp: dict[str, Any], seed: int, epoch: int) -> tuple[float, float]:
        """(val_accuracy, CPU seconds) of ``epoch`` (1-based) of config ``hp``."""
        key = config_key(hp, seed)
        curve = self.curves.setdefault(key, {"acc": [], "cpu": []})
        while len(curve["acc"]) < epoch:
            trainer = self.live.get(key)
            if trainer is None or trainer.epoch != len(curve["acc"]):
                trainer = self.live[key] = DigitsTrainer(self.data, hp, seed)
                for cached in list(curve["acc"]):  # replay the cached prefix
                    acc, _ = trainer.train_epoch()
                    self.epochs_trained += 1
                    self.replay_mismatches += acc != cached
            acc, cpu = trainer.train_epoch()
            self.epochs_trained += 1
            curve["acc"].append(acc)
            curve["cpu"].append(cpu)
        return curve["acc"][epoch - 1], curve["cpu"][epoch - 1]

    def release(self, hp: dict[str, Any], seed: int) -> None:
        """Forget the in-memory model of a config (its trial is over)."""
        self.live.pop(config_key(hp, seed), None)

    def release_all(self) -> None:
        self.live.clear()

    def save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({"torch": torch.__version__, "curves": self.curves}))
        tmp.replace(self.path)
