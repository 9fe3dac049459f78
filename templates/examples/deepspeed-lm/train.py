"""A small character-level transformer LM, trained with DeepSpeed on every rank of the job.

Inside a dlhpc job each rank (``srun`` starts nodes x tasks_per_node of them)
gets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT from the worker;
the DeepSpeed config comes from the experiment's ``deepspeed:`` section. Run by
hand (``python train.py``) it trains one process with DEFAULTS and
``ds_config.json``.

Every step each rank trains on its own micro-batch (drawn from a generator
seeded by seed, step and rank, so no data position needs saving). Rank 0
reports ``train_loss`` (mean over ranks and the last ``log_every`` steps) and
``val_loss``. The run checkpoints every ``ckpt_every`` steps, and when the job
is preempted or nears its time limit all ranks checkpoint together and exit to
be requeued; the next attempt resumes bitwise where it stopped. At the end rank
0 writes ``final.json`` (losses, weights sha256) into the checkpoint folder.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import socket
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import dlhpc
from dlhpc.harness import deepspeed as dsh

HERE = Path(__file__).resolve().parent
# Used only outside a dlhpc job; inside one, trial.json wins.
DEFAULTS: dict[str, Any] = {
    "layers": 2,
    "d_model": 64,
    "heads": 4,
    "context": 32,
    "log_every": 10,
    "eval_every": 30,
    "ckpt_every": 20,
    "max_length": 60,
}


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        att = att.masked_fill(causal, float("-inf"))
        y = (att.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.drop(self.proj(y))
        out: torch.Tensor = x + self.drop(self.mlp(self.ln2(x)))
        return out


class CharLM(nn.Module):
    def __init__(self, vocab: int, d: int, heads: int, layers: int, context: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(context, d)
        self.blocks = nn.Sequential(*(Block(d, heads) for _ in range(layers)))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        logits: torch.Tensor = self.head(self.ln(self.blocks(x)))
        return logits


def load_text() -> tuple[torch.Tensor, torch.Tensor, int]:
    text = (HERE / "corpus.txt").read_text(encoding="utf-8")
    vocab = sorted(set(text))
    ids = torch.tensor([vocab.index(c) for c in text], dtype=torch.long)
    cut = int(len(ids) * 0.9)
    return ids[:cut], ids[cut:], len(vocab)


def batch(data: torch.Tensor, size: int, context: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(data) - context - 1, (size,), generator=g)
    x = torch.stack([data[s : s + context] for s in starts])
    y = torch.stack([data[s + 1 : s + 1 + context] for s in starts])
    return x, y


def mean_over_ranks(total: float, count: int, device: Any) -> float:
    t = torch.tensor([total, float(count)], dtype=torch.float64, device=device)  # NCCL: GPU
    dist.all_reduce(t)
    return float(t[0] / t[1])


def evaluate(engine: Any, val: torch.Tensor, context: int) -> float:
    rank, world = dist.get_rank(), dist.get_world_size()
    starts = range(rank * context, len(val) - context - 1, world * context)  # this rank's share
    total, count = 0.0, 0
    engine.eval()
    with torch.no_grad():
        for s in starts:
            x, y = val[s : s + context][None], val[s + 1 : s + 1 + context][None]
            x, y = x.to(engine.device), y.to(engine.device)
            total += F.cross_entropy(engine(x).flatten(0, 1), y.flatten(), reduction="sum").item()
            count += context
    engine.train()
    return mean_over_ranks(total, count, engine.device)


def weights_sha256(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(flat.view(torch.uint8).numpy().tobytes())  # bf16 has no numpy dtype
    return digest.hexdigest()


def main() -> None:
    torch.set_num_threads(int(os.environ.get("SLURM_CPUS_PER_TASK", "1")))
    ctx = dlhpc.init(local_hparams=DEFAULTS)
    if ctx.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS needs it on GPUs
        torch.use_deterministic_algorithms(True)
        # Not filling torch.empty() with NaN: DeepSpeed allocates large buckets each step,
        # and filling them costs far more than the step (CPU results stay bitwise equal).
        torch.utils.deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]
    hp = ctx.hparams
    context, total = int(hp["context"]), ctx.max_length
    log_every, eval_every = int(hp["log_every"]), int(hp["eval_every"])
    ckpt_every, step_sleep = int(hp["ckpt_every"]), float(hp.get("step_sleep", 0.0))
    train, val, vocab = load_text()

    torch.manual_seed(ctx.seed)  # identical initial weights on every rank
    model = CharLM(vocab, int(hp["d_model"]), int(hp["heads"]), int(hp["layers"]), context)
    in_job = ctx.spec is not None and ctx.spec.deepspeed is not None
    engine = dsh.build_engine(ctx, model, config=None if in_job else HERE / "ds_config.json")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(ctx.seed * 1000 + 1 + rank)  # dropout differs between ranks

    seen: dict[str, Any] = {
        "rank": rank,
        "world": world,
        "env_world": int(os.environ["WORLD_SIZE"]),
    }
    seen |= {"local_rank": int(os.environ["LOCAL_RANK"]), "host": socket.gethostname()}
    seen |= {"master": f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"}
    dtype = next(engine.module.parameters()).dtype
    seen |= {"backend": dist.get_backend(), "device": str(engine.device), "dtype": str(dtype)}
    print(f"[deepspeed-lm] {json.dumps(seen)}", flush=True)
    views: list[Any] = [None] * world
    dist.all_gather_object(views, seen)
    ctx.log("info", f"ranks: {json.dumps(views)}")

    group: list[float] = []  # this rank's losses since the last train_loss report
    last_train = float("nan")

    def extras() -> dict[str, Any]:  # saved with every checkpoint
        return {"group": list(group), "last_train": last_train}

    if ctx.spec is not None:
        state = dsh.engine_state(ctx, engine, extras_fn=extras)
    else:  # by hand: checkpoints outside the workdir (dlhpc would snapshot them)
        local = Path(os.environ.get("TMPDIR", "/tmp")) / "deepspeed-lm-checkpoints"
        state = dsh.EngineState(engine, local, extras_fn=extras)
    if state.restore():
        group, last_train = list(state.extras["group"]), float(state.extras["last_train"])
    finished_before = state.step >= total  # stopped after its final checkpoint
    micro = engine.train_micro_batch_size_per_gpu()
    while state.step < total:
        seed = ((ctx.seed * 1_000_003 + state.step) * 4099 + rank) % 2**63
        x, y = (t.to(engine.device) for t in batch(train, micro, context, seed))
        loss = F.cross_entropy(engine(x).flatten(0, 1), y.flatten())
        engine.backward(loss)
        engine.step()
        state.step += 1
        group.append(loss.item())
        if state.step % log_every == 0:
            last_train = mean_over_ranks(sum(group), len(group), engine.device)
            group = []
            ctx.report(state.step, {"train_loss": last_train})
        if state.step % eval_every == 0 and state.step < total:
            ctx.report(state.step, {"val_loss": evaluate(engine, val, context)})
        if state.step % ckpt_every == 0 and state.step < total:
            ctx.checkpoint(state)  # every rank: the save is collective
        if step_sleep:
            time.sleep(step_sleep)
        dsh.step(ctx, state)  # all ranks agree to stop: checkpoint and exit for requeue

    val_loss = evaluate(engine, val, context)
    if not finished_before:
        ctx.report(total, {"val_loss": val_loss})
        ctx.checkpoint(state)
    if rank == 0 and ctx.checkpoint_dir is not None:
        final: dict[str, Any] = {"step": state.step, "val_loss": val_loss, "train_loss": last_train}
        final["weights_sha256"] = weights_sha256(engine.module)  # ZeRO-2: full weights
        (ctx.checkpoint_dir / "final.json").write_text(json.dumps(final))
        print(f"[deepspeed-lm] final {json.dumps(final)}", flush=True)
    ctx.close()


if __name__ == "__main__":
    main()
