"""Atomic sharded DeepSpeed checkpoints (:class:`EngineState`), in dlhpc's checkpoint folders.

Checkpoint contract. :meth:`EngineState.save` is collective (every rank calls
it at the same step). Rank 0 makes a staging folder ``.tmp-ckpt-<step>-<uuid>``
under the trial's checkpoint folder; every rank writes its DeepSpeed shards
there (``engine.save_checkpoint(staging, tag="ds", save_latest=False)``) and
its own ``dlhpc/rank-<r>.pt`` (counters, RNG states, generators, extras); the
ranks agree that all writes succeeded (an all-reduce, i.e. a barrier); then
rank 0 publishes the folder with :func:`~dlhpc.harness.checkpoint.publish_checkpoint`
(files hashed, ``MANIFEST.json`` written last). A crash at any point leaves a
temp folder that readers skip and ``prune`` removes, never a loadable torn
checkpoint. DeepSpeed's ``latest`` file is neither written nor read:
:meth:`EngineState.restore` loads the newest *verified* checkpoint by its
manifest, with an explicit tag.

World size. A checkpoint resumes with the world size it was saved with (ZeRO
0-3). With another world size, a checkpoint without partitioned optimizer
shards loads as it is; one with shards (ZeRO 1-3, bf16) is first converted by
rank 0 to DeepSpeed's universal format (``ds_to_universal``), published as a
re-save of the same step, and loaded with ``load_universal``; where that
conversion fails, :class:`WorldSizeMismatch` names both world sizes. Each rank's
RNG states and generators are restored only with the same world size; after a
change (``EngineState.resharded``) the script reseeds what depends on the rank.

A rank that fails inside ``engine.save_checkpoint`` while the others wait in
one of DeepSpeed's own collectives cannot be voted out: the job then ends at the
process group's timeout, and the previous checkpoint stays the newest.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
from argparse import Namespace
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from dlhpc._failpoints import failpoint
from dlhpc.errors import DlhpcError
from dlhpc.harness.state import loop_payload, restore_loop
from dlhpc.protocol.checkpoint import (
    Checkpoint,
    latest_verified,
    prune,
    publish_checkpoint,
    temp_checkpoint_dir,
)

if TYPE_CHECKING:
    from dlhpc.harness.context import TrialContext

__all__ = ["ENGINE_TAG", "EngineState", "WorldSizeMismatch"]

ENGINE_TAG = "ds"  # DeepSpeed's tag folder inside each dlhpc checkpoint
_STATE_DIR = "dlhpc"
_FORMAT = 1
_KIND = "deepspeed"


class WorldSizeMismatch(DlhpcError):
    """A checkpoint cannot be resumed with this job's number of ranks."""


def _rank_file(rank: int) -> str:
    return f"{_STATE_DIR}/rank-{rank:05d}.pt"


# -- collectives (no-ops in a single process without torch.distributed) ---------


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _broadcast(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank."""
    if _world()[1] == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _any(flag: bool, device: Any) -> bool:
    """True on every rank if ``flag`` is true on any rank (also a barrier)."""
    if _world()[1] == 1:
        return flag
    t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


# -- checkpoints -----------------------------------------------------------------


class EngineState:
    """A DeepSpeed engine plus the loop's counters and RNGs; atomic sharded checkpoints.

    Same counters as :class:`~dlhpc.harness.state.TrainState`: ``epoch``,
    ``batch`` (batches of the epoch already trained), ``step`` (global step,
    the checkpoint's step), and ``extras`` (a picklable dict; ``extras_fn()``
    is merged in at each save). ``generators`` are named ``torch.Generator``\\ s
    saved per rank. :meth:`save` and :meth:`restore` are collective; see the
    module docstring for the contract. Works in a single process too.
    """

    def __init__(
        self,
        engine: Any,
        checkpoint_dir: Path,
        *,
        generators: dict[str, torch.Generator] | None = None,
        extras_fn: Callable[[], dict[str, Any]] | None = None,
        keep_latest: int | None = 1,
        on_event: Callable[[str, str], None] | None = None,
    ) -> None:
        if keep_latest is not None and (not isinstance(keep_latest, int) or keep_latest < 1):
            raise ValueError(f"keep_latest must be an int >= 1 or None, got {keep_latest!r}")
        self.engine = engine
        self.checkpoint_dir = Path(checkpoint_dir)
        self.generators: dict[str, torch.Generator] = dict(generators or {})
        self.extras_fn = extras_fn
        self.keep_latest = keep_latest
        self.on_event = on_event
        self.rank, self.world_size = _world()
        self.epoch = 0
        self.batch = 0
        self.step = 0
        self.extras: dict[str, Any] = {}
        self.restored_from: Checkpoint | None = None
        self.last_checkpoint: Checkpoint | None = None
        self.skipped: list[tuple[Path, str]] = []
        self.resharded = False  # restored from a checkpoint saved by another world size

    def _tell(self, level: str, message: str) -> None:
        if self.on_event is not None and self.rank == 0:
            self.on_event(level, message)

    def should_stop(self, ctx: TrialContext) -> bool:
        """Collective: True on every rank once any rank's ``ctx`` was asked to stop."""
        return _any(ctx.should_stop(), self.engine.device)

    def save(self) -> Checkpoint | None:
        """Collective: publish a checkpoint of the engine and this state.

        Returns the checkpoint on rank 0, None on the others; raises DlhpcError on
        every rank if any rank failed (nothing is published then). RNGs are
        captured before DeepSpeed writes and not consumed.
        """
        payload = {**loop_payload(self, _FORMAT), "rank": self.rank, "world_size": self.world_size}
        staging: Path | None = None
        error = ""
        if self.rank == 0:
            try:
                self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
                staging = temp_checkpoint_dir(self.checkpoint_dir, self.step)
                staging.mkdir()
            except OSError as err:
                error = f"cannot create a staging folder in {self.checkpoint_dir}: {err}"
        where, error = _broadcast((str(staging or ""), error))
        if error:
            raise DlhpcError(error)
        staging = Path(where)
        failed = ""
        try:
            self.engine.save_checkpoint(str(staging), tag=ENGINE_TAG, save_latest=False)
            (staging / _STATE_DIR).mkdir(exist_ok=True)
            torch.save(payload, staging / _rank_file(self.rank))
            failpoint("ds-ckpt-staged")
        except Exception as err:  # every rank must reach the vote below
            failed = f"rank {self.rank}: {type(err).__name__}: {err}"
        if _any(bool(failed), self.engine.device):
            if self.rank == 0:
                shutil.rmtree(staging, ignore_errors=True)
            raise DlhpcError(f"checkpoint of step {self.step} failed on some rank; {failed}")
        ckpt: Checkpoint | None = None
        if self.rank == 0:
            try:
                ckpt = self._publish(staging)
            except Exception as err:
                failed = f"publishing {staging} failed: {type(err).__name__}: {err}"
        failed = _broadcast(failed)
        if failed:
            raise DlhpcError(failed)
        self.last_checkpoint = ckpt
        return ckpt

    def _publish(self, staging: Path) -> Checkpoint:
        def move_in(folder: Path) -> None:
            for child in staging.iterdir():
                os.replace(child, folder / child.name)

        meta = {
            "kind": _KIND,
            "epoch": self.epoch,
            "batch": self.batch,
            "step": self.step,
            "world_size": self.world_size,
            "zero_stage": int(self.engine.zero_optimization_stage()),
            "universal": False,
        }
        try:
            ckpt = publish_checkpoint(self.checkpoint_dir, self.step, move_in, meta)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        prune(self.checkpoint_dir, self.keep_latest, {ckpt.path.name}, verify_hashes=False)
        return ckpt

    def restore(self) -> bool:
        """Collective: load the newest verified checkpoint; False on a fresh start.

        Rank 0 picks it (torn folders are skipped, reported and listed in
        ``skipped``) and converts it if the world size changed (see the module
        docstring); every rank then loads it with an explicit tag.
        """
        plan: dict[str, Any] = {}
        if self.rank == 0:
            try:
                plan = self._plan()
            except Exception as err:  # every rank must raise, not hang
                plan = {"error": f"{type(err).__name__}: {err}", "type": type(err).__name__}
        plan = _broadcast(plan)
        self.skipped = [(Path(p), r) for p, r in plan.get("skipped", [])]
        if "error" in plan:
            kind = WorldSizeMismatch if plan["type"] == "WorldSizeMismatch" else DlhpcError
            raise kind(plan["error"])
        if not plan.get("path"):
            return False
        path = Path(plan["path"])
        self._load_engine(path, bool(plan["universal"]))
        same = plan["world_size"] == self.world_size
        self.resharded = not same
        mine = torch.load(
            path / _rank_file(self.rank if same else 0), map_location="cpu", weights_only=False
        )
        if mine.get("format") != _FORMAT:
            raise DlhpcError(f"{path}: unknown dlhpc state format")
        if set(mine["generators"]) != set(self.generators):
            raise DlhpcError(
                f"{path}: generators saved {sorted(mine['generators'])} != given "
                f"{sorted(self.generators)}"
            )
        # resharded: another rank's RNG streams would be wrong, not just different
        restore_loop(self, mine, rng=same)
        self.restored_from = self.last_checkpoint = plan["checkpoint"]
        self._tell("info", f"restored {path.name} (epoch {self.epoch}, step {self.step})")
        return True

    def _plan(self) -> dict[str, Any]:
        """Rank 0: which checkpoint to load, and how."""
        ckpt, torn = latest_verified(self.checkpoint_dir, verify_hashes=True)
        skipped = [(str(t.path), t.reason) for t in torn]
        for path, reason in skipped:
            self._tell("warning", f"skipped torn checkpoint {path}: {reason}")
        if ckpt is None:
            return {"skipped": skipped}
        meta = ckpt.metadata
        if meta.get("kind") != _KIND:
            raise DlhpcError(f"{ckpt.path} is not a DeepSpeed checkpoint of dlhpc")
        saved = int(meta["world_size"])
        universal = bool(meta.get("universal"))
        if saved != self.world_size and not universal and self._partitioned(ckpt):
            ckpt = self._to_universal(ckpt, saved)
            universal = True
        return {
            "skipped": skipped,
            "path": str(ckpt.path),
            "universal": universal,
            "world_size": saved,
            "checkpoint": ckpt,
        }

    @staticmethod
    def _partitioned(ckpt: Checkpoint) -> bool:
        """Whether the optimizer state is sharded over the saving ranks."""
        return any(
            rel.startswith(f"{ENGINE_TAG}/") and "zero_pp_rank_" in rel and "optim_states" in rel
            for rel in ckpt.files
        )

    def _to_universal(self, ckpt: Checkpoint, saved: int) -> Checkpoint:
        """Rank 0: convert ``ckpt`` to a universal checkpoint, published as a re-save."""
        from deepspeed.checkpoint import ds_to_universal

        def convert(folder: Path) -> None:
            args = Namespace(
                input_folder=str(ckpt.path / ENGINE_TAG),
                output_folder=str(folder / ENGINE_TAG),
                num_extract_workers=1,
                num_merge_workers=1,
                keep_temp_folder=False,
                strict=True,
                inject_missing_state=True,
            )
            with contextlib.redirect_stdout(io.StringIO()):
                ds_to_universal.main(args)
            shutil.copytree(ckpt.path / _STATE_DIR, folder / _STATE_DIR)

        meta = {**ckpt.metadata, "universal": True}
        try:
            new = publish_checkpoint(self.checkpoint_dir, ckpt.step, convert, meta)
        except Exception as err:
            raise WorldSizeMismatch(
                f"{ckpt.path} was saved by {saved} ranks and this job has "
                f"{self.world_size}; converting it to a universal checkpoint failed "
                f"({type(err).__name__}: {err}); resume with {saved} ranks"
            ) from err
        self._tell("info", f"converted {ckpt.path.name} ({saved} ranks) to {new.path.name}")
        return new

    def _load_engine(self, path: Path, universal: bool) -> None:
        config = self.engine._config  # DeepSpeed reads this flag at load time only
        before = config.load_universal_checkpoint
        config.load_universal_checkpoint = universal
        try:
            loaded, _ = self.engine.load_checkpoint(
                str(path), tag=ENGINE_TAG, load_module_strict=True
            )
        finally:
            config.load_universal_checkpoint = before
        if loaded is None:
            raise DlhpcError(f"DeepSpeed could not load {path / ENGINE_TAG}")
