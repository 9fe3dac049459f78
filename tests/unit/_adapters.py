"""Running the framework examples as dlhpc jobs without Slurm: a trial folder with its
``trial.json``, attempts as plain processes, and the final weights' hash.

Shared by the adapter unit tests and their cluster tests (which compare the cluster's
result with a reference trained here, in one go).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from dlhpc.protocol import TrialSpec, read_event_batches
from dlhpc.protocol.checkpoint import latest_verified

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "templates" / "examples"


def require(extra: str, *modules: str) -> None:
    """Skip without ``modules``, unless CI is set: there it is a failure."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        message = f"needs {', '.join(missing)} (pip install 'dlhpc[{extra}]')"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


class Trial:
    """One trial of ``example`` run by hand: ``root/trial/trial.json``, checkpoints in
    ``root/ckpt``, attempt ``n`` in ``root/trial/attempts/n``."""

    def __init__(self, root: Path, example: str, hparams: Mapping[str, Any], seed: int = 7):
        self.root, self.example = root, EXAMPLES / example
        self.hparams, self.seed = dict(hparams), seed
        self.trial_dir = root / "trial"
        self.checkpoint_dir = root / "ckpt"
        self.attempts = 0

    def _spec(self, max_length: int, **hp: Any) -> None:
        TrialSpec(
            experiment_id=1,
            trial_id=1,
            hparams={**self.hparams, **hp},
            max_length=max_length,
            seed=self.seed,
            experiment_dir=str(self.root),
            code_dir=str(self.example),
            entry_script="",
            checkpoint_dir=str(self.checkpoint_dir),
            metric="val_accuracy",
            smaller_is_better=False,
            deterministic=True,
        ).write(self.trial_dir / "trial.json")

    def start(self, max_length: int, **hp: Any) -> subprocess.Popen[str]:
        """Start the next attempt of ``train.py`` (``hp`` overrides hyperparameters)."""
        self.trial_dir.mkdir(parents=True, exist_ok=True)
        self._spec(max_length, **hp)
        attempt = self.trial_dir / "attempts" / str(self.attempts)
        self.attempts += 1
        base = {k: v for k, v in os.environ.items() if not k.startswith(("DLHPC_", "SLURM_"))}
        env = {
            **base,
            "DLHPC_TRIAL_DIR": str(self.trial_dir),
            "DLHPC_ATTEMPT_DIR": str(attempt),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(REPO),
        }
        return subprocess.Popen(
            [sys.executable, "train.py"],
            cwd=self.example,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def run(self, max_length: int, **hp: Any) -> tuple[int, str]:
        """Run one attempt to its end: (exit code, output)."""
        proc = self.start(max_length, **hp)
        out, _ = proc.communicate(timeout=300)
        return proc.returncode, out

    def run_until(
        self, max_length: int, ready: Callable[[], bool], sig: int = signal.SIGTERM, **hp: Any
    ) -> tuple[int, str]:
        """Run one attempt, send ``sig`` once ``ready()`` holds: (exit code, output)."""
        proc = self.start(max_length, **hp)
        deadline = time.monotonic() + 240
        while not ready():
            if proc.poll() is not None or time.monotonic() > deadline:
                out, _ = proc.communicate()
                raise AssertionError(f"ended (or timed out) before the signal:\n{out}")
            time.sleep(0.1)
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=300)
        return proc.returncode, out

    def start_ranks(
        self, max_length: int, argv: list[str], ranks: int = 2, **hp: Any
    ) -> list[subprocess.Popen[str]]:
        """Start the next attempt as ``ranks`` DDP processes (gloo, this host), with the
        variables dlhpc's worker sets (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT)."""
        self.trial_dir.mkdir(parents=True, exist_ok=True)
        self._spec(max_length, **hp)
        attempt = self.trial_dir / "attempts" / str(self.attempts)
        self.attempts += 1
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = str(s.getsockname()[1])
        base = {k: v for k, v in os.environ.items() if not k.startswith(("DLHPC_", "SLURM_"))}
        procs = []
        for rank in range(ranks):
            env = {
                **base,
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(ranks),
                "LOCAL_WORLD_SIZE": str(ranks),
                "NODE_RANK": "0",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": port,
                "DLHPC_TRIAL_DIR": str(self.trial_dir),
                "DLHPC_ATTEMPT_DIR": str(attempt),
                "HF_HUB_OFFLINE": "1",
                "OMP_NUM_THREADS": "1",
                "PYTHONPATH": str(REPO),
                "PYTHONUNBUFFERED": "1",  # a rank that aborts has printed all it wrote
            }
            procs.append(
                subprocess.Popen(
                    argv,
                    cwd=self.example,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            )
        return procs

    def checkpoints(self) -> list[str]:
        if not self.checkpoint_dir.is_dir():
            return []
        return sorted(p.name for p in self.checkpoint_dir.iterdir() if p.name.startswith("ckpt-"))

    def metrics(self) -> dict[int, dict[str, float]]:
        """Every metric record of every attempt, by step (a later attempt's record wins)."""
        out: dict[int, dict[str, float]] = {}
        for attempt in sorted((self.trial_dir / "attempts").iterdir(), key=lambda p: int(p.name)):
            for batch in read_event_batches(attempt):
                for r in batch.records:
                    if r["type"] == "metric":
                        out.setdefault(int(r["step"]), {}).update(r["metrics"])
        return out

    def events(self, kind: str) -> list[dict[str, Any]]:
        found = []
        for attempt in (self.trial_dir / "attempts").iterdir():
            for batch in read_event_batches(attempt):
                found += [r for r in batch.records if r["type"] == kind]
        return found


def rank_outputs(procs: list[subprocess.Popen[str]], outs: list[str], tail: int = 2000) -> str:
    """A failure message: each rank's exit code and the last ``tail`` characters of its
    output (pytest cuts a long message, which would hide the rank that failed)."""
    return "\n".join(
        f"== rank {rank} exited {proc.returncode}:\n{out[-tail:]}"
        for rank, (proc, out) in enumerate(zip(procs, outs, strict=True))
    )


def state_dict_sha(state_dict: Mapping[str, Any]) -> str:
    """sha256 over the tensors of a state dict, by sorted name."""
    digest = hashlib.sha256()
    for name, tensor in sorted(state_dict.items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def lightning_weights_sha(checkpoint_dir: Path) -> str:
    """The hash of the model weights in the newest verified Lightning checkpoint."""
    import torch

    ckpt, _ = latest_verified(checkpoint_dir)
    assert ckpt is not None, f"no verified checkpoint in {checkpoint_dir}"
    content = torch.load(ckpt.path / "lightning.ckpt", map_location="cpu", weights_only=False)
    return state_dict_sha(content["state_dict"])
