"""The full training state, saved to and restored from atomic checkpoints.

Imported only by training scripts (it imports torch). One checkpoint holds one
``state.pt``: model / optimizer / scheduler / scaler state dicts, every RNG
(python ``random``, numpy's global, torch CPU, torch CUDA on all devices),
named ``torch.Generator`` states, the position counters and user extras. With
the same code, data and deterministic kernels, a resumed run continues
bit-for-bit as if it had never stopped.

The resume pattern (save at any point; RNGs are captured at that point)::

    state = TrainState(ckpt_dir, model=model, optimizer=opt, scheduler=sched,
                       generators={"data": g})
    state.restore()                          # False on a fresh start
    for epoch in range(state.epoch, epochs):
        g.manual_seed(seed + epoch)          # loader = DataLoader(..., shuffle=True, generator=g)
        for i, (x, y) in enumerate(loader):
            if i < state.batch:              # mid-epoch resume: skip what was trained
                continue
            ...                              # one training step
            state.batch, state.step = i + 1, state.step + 1
            if state.step % every == 0:
                state.save()
        sched.step()
        state.epoch, state.batch = epoch + 1, 0
        state.save()

Pass ``generator=`` to the DataLoader: without it each ``iter(loader)`` draws
a seed from the global torch RNG, which a mid-epoch resume would draw twice.
Skipping by iterating loads the skipped samples; if ``__getitem__`` draws from
a global RNG (random augmentation), skip at the sampler level instead
(``itertools.islice(loader.batch_sampler, state.batch, None)``).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import torch

from dlhpc.errors import DlhpcError
from dlhpc.protocol.checkpoint import (
    Checkpoint,
    latest_verified,
    prune,
    publish_checkpoint,
)

__all__ = ["STATE_FILE", "StateMismatchError", "Stateful", "TrainState"]

STATE_FILE = "state.pt"
_FORMAT = 1
_COMPONENTS = ("model", "optimizer", "scheduler", "scaler")


class StateMismatchError(DlhpcError):
    """A checkpoint does not fit the objects it is being restored into."""


class Stateful(Protocol):
    """Anything with torch-style ``state_dict`` / ``load_state_dict``."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state_dict: Any, /) -> Any: ...


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module under DistributedDataParallel / DataParallel / torch.compile wrappers."""
    wrappers = (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)
    while True:
        inner = model.module if isinstance(model, wrappers) else getattr(model, "_orig_mod", None)
        if not isinstance(inner, torch.nn.Module):
            return model
        model = inner


def rng_state() -> dict[str, Any]:
    """Python's, NumPy's global (None without NumPy), torch's CPU and every CUDA
    device's RNG state: what a checkpoint needs to resume the same random stream."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy ships with torch in practice
        state["numpy"] = None
    else:
        state["numpy"] = np.random.get_state()
    state["cuda"] = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Set the RNGs :func:`rng_state` captured (CUDA devices present here only)."""
    random.setstate(state["python"])
    if state.get("numpy") is not None:
        import numpy as np

        np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda and torch.cuda.is_available():
        for device, s in enumerate(cuda[: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(s, device)


def _nonneg_int(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"TrainState.{name} must be a non-negative int, got {value!r}")
    return value


class _LoopState(Protocol):
    """What :class:`TrainState` and the DeepSpeed ``EngineState`` share: the loop's
    counters, named generators and extras."""

    epoch: int
    batch: int
    step: int
    extras: dict[str, Any]
    extras_fn: Callable[[], dict[str, Any]] | None
    generators: dict[str, torch.Generator]


def loop_payload(state: _LoopState, fmt: int) -> dict[str, Any]:
    """The part of a checkpoint payload every training state saves: ``format``, the
    counters (checked non-negative ints), generator and global RNG states, and the
    extras with ``extras_fn()`` merged in. Consumes no RNG."""
    extras = dict(state.extras)
    if state.extras_fn is not None:
        extras.update(state.extras_fn())
    return {
        "format": fmt,
        "counters": {
            "epoch": _nonneg_int("epoch", state.epoch),
            "batch": _nonneg_int("batch", state.batch),
            "step": _nonneg_int("step", state.step),
        },
        "generators": {name: g.get_state() for name, g in state.generators.items()},
        "rng": rng_state(),
        "extras": extras,
    }


def restore_loop(state: _LoopState, payload: Mapping[str, Any], rng: bool = True) -> None:
    """The inverse of :func:`loop_payload`: the counters and extras of ``payload`` set on
    ``state``, and (``rng``) its generators' and the process's RNG states. The caller
    has checked the payload's format and generator names."""
    if rng:
        for name, g in state.generators.items():
            g.set_state(payload["generators"][name])
        set_rng_state(payload["rng"])
    counters = payload["counters"]
    state.epoch, state.batch, state.step = counters["epoch"], counters["batch"], counters["step"]
    state.extras = dict(payload["extras"])


class TrainState:
    """Everything needed to resume training exactly; see the module docstring.

    Counters: ``epoch`` (current epoch), ``batch`` (batches of it already
    trained), ``step`` (global step, also the checkpoint's step). ``extras`` is
    a dict saved with the state (anything ``torch.save`` can pickle);
    ``extras_fn()``, if given, is called at each save and its dict is merged
    into the saved extras (not into ``self.extras``).

    Only rank 0 writes; every rank restores (from the same shared folder), so
    ranks other than 0 get rank 0's RNG states.
    """

    def __init__(
        self,
        checkpoint_dir: Path,
        *,
        model: torch.nn.Module | None = None,
        optimizer: Stateful | None = None,
        scheduler: Stateful | None = None,
        scaler: Stateful | None = None,
        generators: dict[str, torch.Generator] | None = None,
        extras_fn: Callable[[], dict[str, Any]] | None = None,
        rank: int = 0,
        keep_latest: int | None = 1,
        on_event: Callable[[str, str], None] | None = None,
    ) -> None:
        if keep_latest is not None and (not isinstance(keep_latest, int) or keep_latest < 1):
            raise ValueError(f"keep_latest must be an int >= 1 or None, got {keep_latest!r}")
        self.checkpoint_dir = Path(checkpoint_dir)
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.scaler = scaler
        self.generators: dict[str, torch.Generator] = dict(generators or {})
        self.extras_fn = extras_fn
        self.rank = rank
        self.keep_latest = keep_latest
        self.epoch = 0
        self.batch = 0
        self.step = 0
        self.extras: dict[str, Any] = {}
        self.restored_from: Checkpoint | None = None
        self.last_checkpoint: Checkpoint | None = None  # newest restored or saved
        self.skipped: list[tuple[Path, str]] = []
        self.on_event = on_event  # (level, message): torn checkpoints, restores

    def _objects(self) -> dict[str, Stateful | None]:
        model = _unwrap(self.model) if self.model is not None else None
        return {
            "model": model,
            "optimizer": self.optimizer,
            "scheduler": self.scheduler,
            "scaler": self.scaler,
        }

    def save(self) -> Checkpoint | None:
        """Publish a checkpoint of the current state (rank 0 only; others return None).

        The previous checkpoint is pruned (down to ``keep_latest``) only after
        the new one is published; with ``keep_latest=None`` (what a dlhpc job
        uses: the reconciler's GC deletes) only torn and stale temp folders go.
        Does not consume any RNG.
        """
        if self.rank != 0:
            return None
        payload = loop_payload(self, _FORMAT)
        payload["state_dicts"] = {
            k: (o.state_dict() if o is not None else None) for k, o in self._objects().items()
        }

        def write(folder: Path) -> None:
            torch.save(payload, folder / STATE_FILE)

        meta = {"epoch": self.epoch, "batch": self.batch, "step": self.step}
        ckpt = publish_checkpoint(self.checkpoint_dir, self.step, write, meta)
        # sha256 was computed from the bytes read back after fsync a moment ago;
        # size checks suffice to tell committed folders from torn ones here.
        prune(self.checkpoint_dir, self.keep_latest, {ckpt.path.name}, verify_hashes=False)
        self.last_checkpoint = ckpt
        return ckpt

    def restore(self) -> bool:
        """Load the newest verified checkpoint into every object; False if there is none.

        Torn or corrupt checkpoints are skipped and listed in ``self.skipped``.
        Raises :class:`StateMismatchError`, before changing anything, when the
        checkpoint's components do not match the objects given; errors from
        ``load_state_dict`` itself (e.g. a shape mismatch) propagate as they are.
        """
        ckpt, torn = latest_verified(self.checkpoint_dir, verify_hashes=True)
        self.skipped = [(t.path, t.reason) for t in torn]
        for path, reason in self.skipped:
            self._tell("warning", f"skipped torn checkpoint {path}: {reason}")
        if ckpt is None:
            return False
        if STATE_FILE not in ckpt.files:
            raise StateMismatchError(f"{ckpt.path} has no {STATE_FILE}: not a TrainState save")
        # weights_only=False is needed for python/numpy RNG states and user extras.
        # It is safe here: the file is our own, and its sha256 has just been checked
        # against the manifest that was committed after it (same trust as the script).
        payload = torch.load(ckpt.path / STATE_FILE, map_location="cpu", weights_only=False)
        self._check(payload, ckpt)
        for key, obj in self._objects().items():
            sd = payload["state_dicts"][key]
            if obj is not None and not (key == "scaler" and sd == {}):  # {}: disabled scaler
                obj.load_state_dict(sd)
        restore_loop(self, payload)
        self.restored_from = self.last_checkpoint = ckpt
        self._tell("info", f"restored {ckpt.path.name} (epoch {self.epoch}, step {self.step})")
        return True

    def _tell(self, level: str, message: str) -> None:
        if self.on_event is not None:
            self.on_event(level, message)

    def _check(self, payload: Any, ckpt: Checkpoint) -> None:
        if not isinstance(payload, dict) or payload.get("format") != _FORMAT:
            raise StateMismatchError(f"{ckpt.path / STATE_FILE}: unknown state format")
        problems = []
        for key, obj in self._objects().items():
            saved = payload["state_dicts"].get(key) is not None
            if saved != (obj is not None):
                have = "has" if saved else "lacks"
                given = "given" if obj is not None else "not given"
                problems.append(f"the checkpoint {have} a {key} state but a {key} was {given}")
        saved_gens, gens = set(payload["generators"]), set(self.generators)
        if saved_gens != gens:
            problems.append(f"generators saved {sorted(saved_gens)} != given {sorted(gens)}")
        if problems:
            raise StateMismatchError(f"cannot restore {ckpt.path}: " + "; ".join(problems))
