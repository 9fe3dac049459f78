"""Fine-tune a tiny BERT on a made-up sentiment task with the Hugging Face Trainer.

``train_plain.py`` is the script before dlhpc (``train_plain_bare.py``: the same with a
bare ``trainer.train()``); ``train.py`` is the same script with the lines dlhpc needs
(``diff train_plain.py train.py``; see README.md). Nothing is downloaded: the model is
built from a config and the tokenizer from a word list.
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

import numpy as np
import torch
from dlhpc.integrations.transformers import DlhpcCallback, hparams
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    PreTrainedTokenizerFast,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    set_seed,
)

POSITIVE = ["good", "great", "fine", "nice", "happy"]
NEGATIVE = ["bad", "awful", "poor", "sad", "wrong"]
NEUTRAL = ["the", "a", "movie", "was", "and", "plot", "actor", "film", "very", "quite"]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
LENGTH = 16


def tokenizer() -> PreTrainedTokenizerFast:
    vocab = {w: i for i, w in enumerate(SPECIAL + POSITIVE + NEGATIVE + NEUTRAL)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]"
    )


class Reviews(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Sentences of random words; the label says whether positive words outnumber negative."""

    def __init__(self, n: int, seed: int, tok: PreTrainedTokenizerFast) -> None:
        rng = random.Random(seed)
        texts, self.labels = [], []
        for _ in range(n):
            words = rng.choices(POSITIVE + NEGATIVE + NEUTRAL * 2, k=rng.randint(4, LENGTH - 2))
            score = sum(w in POSITIVE for w in words) - sum(w in NEGATIVE for w in words)
            texts.append("[CLS] " + " ".join(words))
            self.labels.append(int(score > 0))
        self.enc = tok(texts, padding="max_length", max_length=LENGTH, return_tensors="pt")

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {
            "input_ids": self.enc["input_ids"][i],
            "attention_mask": self.enc["attention_mask"][i],
            "labels": torch.tensor(self.labels[i]),
        }


def accuracy(pred: Any) -> dict[str, float]:
    return {"accuracy": float((np.argmax(pred.predictions, axis=-1) == pred.label_ids).mean())}


class SlowDown(TrainerCallback):
    """Sleeps after each step: slows training down, for preemption demos."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        time.sleep(self.seconds)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--hidden", type=int, default=16)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--step-sleep", type=float, default=0.0)
    return p.parse_args()


def main() -> None:
    args = hparams(parse_args())
    torch.set_num_threads(1)
    set_seed(args.seed)
    tok = tokenizer()
    config = BertConfig(
        vocab_size=len(tok),
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=2,
        intermediate_size=2 * args.hidden,
        max_position_embeddings=LENGTH,
        num_labels=2,
    )
    model = BertForSequenceClassification(config)
    targs = TrainingArguments(
        output_dir="hf-output",
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        per_device_train_batch_size=args.batch_size,
        num_train_epochs=args.epochs,
        seed=args.seed,
        eval_strategy="epoch",
        save_strategy="epoch",
        logging_strategy="epoch",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        full_determinism=True,
    )
    trainer = Trainer(
        model=model,
        args=targs,
        train_dataset=Reviews(512, 1, tok),
        eval_dataset=Reviews(128, 2, tok),
        compute_metrics=accuracy,
        callbacks=[SlowDown(args.step_sleep), DlhpcCallback()],
    )
    trainer.train(resume_from_checkpoint=targs.resume_from_checkpoint)


if __name__ == "__main__":
    main()
