"""TrainState: a resumed run is bitwise identical to an uninterrupted one."""

from __future__ import annotations

import contextlib
import hashlib
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from dlhpc.harness.state import STATE_FILE, StateMismatchError, TrainState  # noqa: E402
from dlhpc.protocol.checkpoint import MANIFEST_NAME, list_checkpoints, publish_checkpoint  # noqa: E402

SEED, N, BS, EPOCHS, SAVE_EVERY = 1234, 48, 8, 4, 4  # 6 batches an epoch, 24 steps


@contextlib.contextmanager
def _deterministic() -> Iterator[None]:
    """Deterministic kernels, one thread; global RNGs and settings restored afterwards."""
    saved = (
        torch.are_deterministic_algorithms_enabled(),
        torch.get_num_threads(),
        random.getstate(),
        np.random.get_state(),
        torch.get_rng_state(),
    )
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    yield
    torch.use_deterministic_algorithms(saved[0])
    torch.set_num_threads(saved[1])
    random.setstate(saved[2])
    np.random.set_state(saved[3])
    torch.set_rng_state(saved[4])


@pytest.fixture(autouse=True)
def deterministic() -> Iterator[None]:
    with _deterministic():
        yield


def _data() -> tuple[Any, Any]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, 6, generator=g)
    return x, (x[:, :2] * 3 - x[:, 2:4]).sin() + 0.1 * torch.randn(N, 2, generator=g)


@dataclass
class Run:
    """One training 'process': everything built fresh, as after a requeue."""

    seed: int
    ckpt_dir: Path
    model: Any = field(init=False)

    def __post_init__(self) -> None:
        random.seed(self.seed)
        np.random.seed(self.seed)
        torch.manual_seed(self.seed)
        self.model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 2))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, step_size=1, gamma=0.8)
        self.g_data = torch.Generator().manual_seed(self.seed)
        self.g_aug = torch.Generator().manual_seed(self.seed + 1)  # never reseeded: restored
        self.state = TrainState(
            self.ckpt_dir,
            model=self.model,
            optimizer=self.opt,
            scheduler=self.sched,
            generators={"data": self.g_data, "aug": self.g_aug},
            extras_fn=lambda: {"lr": self.sched.get_last_lr()},
            keep_latest=2,
        )

    def train(self, losses: dict[int, float], kill: tuple[str, int] | None = None) -> bool:
        """Train to the end (True) or until ``kill`` (False). Recomputed steps must match."""
        state, model = self.state, self.model
        loader = DataLoader(
            TensorDataset(*_data()), batch_size=BS, shuffle=True, generator=self.g_data
        )
        for epoch in range(state.epoch, EPOCHS):
            self.g_data.manual_seed(SEED + epoch)
            model.train()
            for i, (x, y) in enumerate(loader):
                if i < state.batch:
                    continue
                x = x + 0.05 * torch.from_numpy(
                    np.random.standard_normal(x.shape).astype(np.float32)
                )
                x = x + 0.05 * torch.randn(x.shape, generator=self.g_aug)
                loss = nn.functional.mse_loss(model(x), y) * (1.0 + 0.1 * random.random())
                self.opt.zero_grad()
                loss.backward()
                self.opt.step()
                state.batch, state.step = i + 1, state.step + 1
                if state.step in losses:  # redone after a kill: must be the very same step
                    assert losses[state.step] == loss.item()
                losses[state.step] = loss.item()
                if state.step % SAVE_EVERY == 0:
                    state.save()
                if kill == ("step", state.step):
                    return False
            self.sched.step()
            state.epoch, state.batch = epoch + 1, 0
            state.extras.setdefault("epochs_done", []).append(epoch)
            state.save()
            if kill == ("epoch", state.epoch):
                return False
        return True


def _digest(sd: dict[str, Any]) -> str:
    h = hashlib.sha256()
    for k in sorted(sd):
        h.update(k.encode() + sd[k].detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def _uninterrupted(tmp: Path) -> tuple[Run, list[float]]:
    run, losses = Run(SEED, tmp), {}
    assert run.state.restore() is False
    assert run.train(losses)
    return run, [losses[s] for s in sorted(losses)]


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, list[float]]:
    with _deterministic():
        return _uninterrupted(tmp_path_factory.mktemp("baseline"))


@pytest.mark.parametrize(
    "kills",
    [
        [("step", 6)],  # mid-epoch, two steps after the last save (lost work is redone)
        [("epoch", 1)],  # right after an epoch-boundary save
        [("step", 12)],  # saved after the last batch but before the epoch-end bookkeeping
        [("step", 5), ("step", 9), ("epoch", 2), ("step", 16), ("step", 23)],
    ],
)
def test_exact_resume(baseline: tuple[Run, list[float]], tmp_path: Path, kills: Any) -> None:
    base, base_losses = baseline
    losses: dict[int, float] = {}
    first = Run(SEED, tmp_path)
    assert first.train(losses, kills[0]) is False
    for n, kill in enumerate([*kills[1:], None]):
        run = Run(SEED + 1000 + n, tmp_path)  # seeded differently: restore must overwrite
        assert run.state.restore() is True and run.state.skipped == []
        assert run.train(losses, kill) is (kill is None)
    assert [losses[s] for s in sorted(losses)] == base_losses
    final, ref = run.model.state_dict(), base.model.state_dict()
    assert final.keys() == ref.keys() and all(torch.equal(final[k], ref[k]) for k in ref)
    assert _digest(final) == _digest(ref)
    opt, ref_opt = run.opt.state_dict()["state"], base.opt.state_dict()["state"]
    assert all(torch.equal(opt[i]["momentum_buffer"], ref_opt[i]["momentum_buffer"]) for i in opt)
    assert run.sched.state_dict() == base.sched.state_dict()
    assert torch.equal(run.g_aug.get_state(), base.g_aug.get_state())
    assert run.state.extras["epochs_done"] == base.state.extras["epochs_done"] == [0, 1, 2, 3]
    assert run.state.step == base.state.step == 24
    assert [c.step for c in list_checkpoints(tmp_path)] == [24, 24]  # keep_latest=2


def test_rngs_restored(tmp_path: Path) -> None:
    state = TrainState(tmp_path)
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    state.save()
    expect = (random.random(), np.random.rand(), torch.rand(1))
    random.seed(2), np.random.seed(2), torch.manual_seed(2)
    assert state.restore()
    assert (random.random(), np.random.rand()) == expect[:2] and torch.equal(
        torch.rand(1), expect[2]
    )


def test_restore_without_checkpoint_changes_nothing(tmp_path: Path) -> None:
    run = Run(SEED, tmp_path / "ckpt")
    before = {k: v.clone() for k, v in run.model.state_dict().items()}
    rng = torch.get_rng_state()
    assert run.state.restore() is False
    assert (run.state.epoch, run.state.batch, run.state.step) == (0, 0, 0)
    assert run.state.restored_from is None and run.state.skipped == []
    assert all(torch.equal(v, before[k]) for k, v in run.model.state_dict().items())
    assert torch.equal(torch.get_rng_state(), rng)


def test_torn_newest_falls_back(tmp_path: Path) -> None:
    run = Run(SEED, tmp_path)
    run.state.step, run.state.extras["tag"] = 1, "one"
    one = run.state.save()
    weights = {k: v.clone() for k, v in run.model.state_dict().items()}
    with torch.no_grad():
        for p in run.model.parameters():
            p.add_(1.0)
    run.state.step, run.state.extras["tag"] = 2, "two"
    two = run.state.save()
    assert one is not None and two is not None
    blob = bytearray((two.path / STATE_FILE).read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    (two.path / STATE_FILE).write_bytes(bytes(blob))
    fresh = Run(SEED + 7, tmp_path)
    assert fresh.state.restore() is True
    assert fresh.state.restored_from == one and fresh.state.step == 1
    assert fresh.state.extras == {"tag": "one", "lr": [0.05]}
    assert fresh.state.skipped == [(two.path, f"file {STATE_FILE}: sha256 mismatch")]
    assert all(torch.equal(v, weights[k]) for k, v in fresh.model.state_dict().items())
    (one.path / MANIFEST_NAME).unlink()
    assert Run(SEED, tmp_path).state.restore() is False


def test_only_rank0_writes_and_prune(tmp_path: Path) -> None:
    assert TrainState(tmp_path, rank=1).save() is None
    assert not tmp_path.exists() or not list(tmp_path.iterdir())
    state = TrainState(tmp_path)
    for s in (1, 2, 3):
        state.step = s
        ckpt = state.save()
    assert ckpt is not None and ckpt.metadata == {"epoch": 0, "batch": 0, "step": 3}
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt-0000000003"]
    state.step = -1
    with pytest.raises(ValueError, match="step"):
        state.save()
    with pytest.raises(ValueError, match="keep_latest"):
        TrainState(tmp_path, keep_latest=0)


def test_wrapped_model_saved_unwrapped(tmp_path: Path) -> None:
    torch.manual_seed(0)
    inner = nn.Linear(3, 2)
    TrainState(tmp_path, model=nn.DataParallel(inner)).save()
    saved = torch.load(tmp_path / "ckpt-0000000000" / STATE_FILE, weights_only=False)
    assert set(saved["state_dicts"]["model"]) == {"weight", "bias"}
    plain = nn.Linear(3, 2)
    assert TrainState(tmp_path, model=plain).restore()
    assert torch.equal(plain.weight, inner.weight)
    wrapped = nn.DataParallel(nn.Linear(3, 2))
    assert TrainState(tmp_path, model=wrapped).restore()
    assert torch.equal(wrapped.module.bias, inner.bias)


def test_mismatch_raises_before_changing_anything(tmp_path: Path) -> None:
    run = Run(SEED, tmp_path)
    run.state.step = 3
    run.state.save()
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 2))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    partial = TrainState(tmp_path, model=model, generators={"data": torch.Generator()})
    with pytest.raises(StateMismatchError, match="optimizer.*scheduler.*generators"):
        partial.restore()
    assert partial.step == 0
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_foreign_checkpoint_is_refused(tmp_path: Path) -> None:
    publish_checkpoint(tmp_path, 1, lambda d: (d / "model.bin").write_bytes(b"x"), {})
    with pytest.raises(StateMismatchError, match=STATE_FILE):
        TrainState(tmp_path).restore()


def test_scaler_roundtrip(tmp_path: Path) -> None:
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0, growth_interval=3)
    TrainState(tmp_path, scaler=scaler).save()
    other = torch.amp.GradScaler("cpu")
    assert TrainState(tmp_path, scaler=other).restore()
    assert other.state_dict() == scaler.state_dict()
    off = torch.amp.GradScaler("cpu", enabled=False)  # saves {}; restoring it is a no-op
    TrainState(tmp_path / "off", scaler=off).save()
    assert TrainState(tmp_path / "off", scaler=torch.amp.GradScaler("cpu", enabled=False)).restore()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_rng_restored(tmp_path: Path) -> None:
    torch.cuda.manual_seed_all(1)
    state = TrainState(tmp_path)
    state.save()
    expect = [torch.rand(4, device=f"cuda:{i}") for i in range(torch.cuda.device_count())]
    torch.cuda.manual_seed_all(2)
    assert state.restore()
    got = [torch.rand(4, device=f"cuda:{i}") for i in range(torch.cuda.device_count())]
    assert all(torch.equal(a, b) for a, b in zip(got, expect, strict=True))
