"""DeepSpeed under dlhpc: config, atomic sharded checkpoints, the collective stop path.

The first tests use a stand-in engine in this process (the checkpoint protocol,
fast). The others run real DeepSpeed ranks (CPU accelerator, gloo on localhost)
as subprocesses of tests/unit/_ds_rank.py: kill during a save, resume bitwise,
ZeRO 1/2/3, and a resume with another world size through a universal checkpoint.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")

from dlhpc.errors import DlhpcError  # noqa: E402
from dlhpc.harness import deepspeed as dsh  # noqa: E402
from dlhpc.harness.context import TrialContext  # noqa: E402
from dlhpc.protocol import REQUEUE_EXIT_CODE  # noqa: E402
from dlhpc.protocol.checkpoint import MANIFEST_NAME, latest_verified, publish_checkpoint  # noqa: E402
from tests.unit._ds_rank import spawn  # noqa: E402
from tests.unit._spec import make_spec  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


class _Config:
    load_universal_checkpoint = False


class FakeEngine:
    """Writes and reads one tensor the way DeepSpeed lays out a ZeRO-2 save of 1 rank."""

    device = "cpu"

    def __init__(self, fail_save: bool = False) -> None:
        self.weight = torch.zeros(3)
        self.fail_save = fail_save
        self._config = _Config()
        self.loaded_universal: list[bool] = []

    def zero_optimization_stage(self) -> int:
        return 2

    def save_checkpoint(self, save_dir: str, tag: str, save_latest: bool = True) -> None:
        assert save_latest is False  # DeepSpeed's `latest` file is never written
        folder = Path(save_dir) / tag
        folder.mkdir(parents=True, exist_ok=True)
        torch.save({"w": self.weight}, folder / "mp_rank_00_model_states.pt")
        if self.fail_save:
            raise OSError("disk full")
        torch.save({}, folder / "zero_pp_rank_0_mp_rank_00_optim_states.pt")

    def load_checkpoint(
        self, load_dir: str, tag: str, load_module_strict: bool = True
    ) -> tuple[str | None, dict[str, Any]]:
        self.loaded_universal.append(self._config.load_universal_checkpoint)
        path = Path(load_dir) / tag / "mp_rank_00_model_states.pt"
        self.weight = torch.load(path)["w"]
        return str(path), {}


def test_a_save_publishes_shards_and_rank_state_and_restores_counters_and_rng(
    tmp_path: Path,
) -> None:
    engine = FakeEngine()
    data = torch.Generator().manual_seed(5)
    state = dsh.EngineState(engine, tmp_path, generators={"data": data}, keep_latest=1)
    assert state.restore() is False
    engine.weight += 1.5
    state.epoch, state.batch, state.step, state.extras = 1, 2, 30, {"note": "x"}
    torch.manual_seed(11)
    random.seed(3)
    ckpt = state.save()
    assert ckpt is not None and ckpt.path.name == "ckpt-0000000030"
    assert set(ckpt.files) == {
        "ds/mp_rank_00_model_states.pt",
        "ds/zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "dlhpc/rank-00000.pt",
    }
    assert ckpt.metadata["world_size"] == 1 and ckpt.metadata["zero_stage"] == 2
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp")]
    expected = (torch.rand(2), random.random(), torch.rand(1, generator=data))

    engine2 = FakeEngine()
    data2 = torch.Generator()
    again = dsh.EngineState(engine2, tmp_path, generators={"data": data2})
    torch.manual_seed(99)
    assert again.restore() is True
    assert (again.epoch, again.batch, again.step, again.extras) == (1, 2, 30, {"note": "x"})
    assert torch.equal(engine2.weight, torch.full((3,), 1.5))
    assert engine2.loaded_universal == [False] and not again.resharded
    got = (torch.rand(2), random.random(), torch.rand(1, generator=data2))
    assert torch.equal(got[0], expected[0]) and got[1] == expected[1]
    assert torch.equal(got[2], expected[2])


def test_a_failed_save_publishes_nothing_and_raises(tmp_path: Path) -> None:
    state = dsh.EngineState(FakeEngine(fail_save=True), tmp_path)
    state.step = 4
    with pytest.raises(DlhpcError, match="disk full"):
        state.save()
    assert list(tmp_path.iterdir()) == []


def test_a_torn_staging_folder_is_skipped_and_the_last_verified_one_restored(
    tmp_path: Path,
) -> None:
    engine = FakeEngine()
    state = dsh.EngineState(engine, tmp_path, keep_latest=2)
    state.step = 10
    engine.weight += 1
    state.save()
    # a save of step 20 killed after the shards were written: never published
    torn = tmp_path / f".tmp-ckpt-20-{'ab' * 16}"
    (torn / "ds").mkdir(parents=True)
    (torn / "ds" / "mp_rank_00_model_states.pt").write_bytes(b"half")
    # and a published folder whose shard was truncated afterwards
    state.step = 15
    engine.weight += 1
    ckpt = state.save()
    assert ckpt is not None
    (ckpt.path / "ds" / "mp_rank_00_model_states.pt").write_bytes(b"bad")
    logs: list[tuple[str, str]] = []
    again = dsh.EngineState(FakeEngine(), tmp_path, on_event=lambda *a: logs.append(a))
    assert again.restore() and again.step == 10
    skipped = {p.name for p, _ in again.skipped}
    assert skipped == {torn.name, "ckpt-0000000015"}
    assert any("skipped torn" in m for _, m in logs)


def test_restore_refuses_a_checkpoint_that_is_not_a_deepspeed_one(tmp_path: Path) -> None:
    publish_checkpoint(tmp_path, 3, lambda f: (f / "state.pt").write_bytes(b"x"), {})
    with pytest.raises(DlhpcError, match="not a DeepSpeed checkpoint"):
        dsh.EngineState(FakeEngine(), tmp_path).restore()


def _ctx(tmp_path: Path, deepspeed: dict[str, Any] | None = None) -> TrialContext:
    spec = make_spec(tmp_path, keep_latest=2, deepspeed=deepspeed)
    return TrialContext(spec, tmp_path / "attempt", {})


def test_the_config_comes_from_the_trial_a_mapping_or_a_file(tmp_path: Path) -> None:
    cfg = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2}}
    ctx = _ctx(tmp_path, cfg)
    got = dsh.load_config(ctx, None)
    assert got == cfg and got is not cfg
    (tmp_path / "ds.json").write_text(json.dumps({"a": 1}))
    assert dsh.load_config(ctx, tmp_path / "ds.json") == {"a": 1}
    assert dsh.load_config(None, {"b": 2}) == {"b": 2}
    with pytest.raises(DlhpcError, match="no DeepSpeed config"):
        dsh.load_config(_ctx(tmp_path), None)
    with pytest.raises(DlhpcError, match="cannot read"):
        dsh.load_config(None, tmp_path / "missing.json")


def test_the_stop_path_checkpoints_through_the_engine_and_exits_for_requeue(
    tmp_path: Path,
) -> None:
    ctx = _ctx(tmp_path)
    state = dsh.engine_state(ctx, FakeEngine())
    assert state.keep_latest is None  # in a job only the reconciler's GC deletes checkpoints
    state.step = 7
    dsh.step(ctx, state)  # nothing asked to stop: returns
    ctx.stop_reason = "TERM"
    with pytest.raises(SystemExit) as stopped:
        dsh.step(ctx, state)
    assert stopped.value.code == REQUEUE_EXIT_CODE
    ckpt, _ = latest_verified(tmp_path / "ckpt")
    assert ckpt is not None and ckpt.step == 7 and (ckpt.path / MANIFEST_NAME).is_file()
    progress = json.loads((tmp_path / "attempt" / "progress.json").read_text())
    assert progress["checkpoint_step"] == 7
    events = "".join(p.read_text() for p in (tmp_path / "attempt").glob("user-r0-*.jsonl"))
    assert '"type": "checkpoint"' in events


# -- real DeepSpeed ranks (gloo on localhost) --------------------------------------


def _ranks(n: int, out: Path, **args: Any) -> dict[int, dict[str, Any]]:
    """Run ``n`` ranks of _ds_rank.py; their results by rank ({} for a killed rank)."""
    out.mkdir(parents=True, exist_ok=True)
    procs = spawn(n, {"out": str(out), **args})
    errors = [p.communicate(timeout=300)[1] for p in procs]
    results = {}
    for r, p in enumerate(procs):
        if args.get("crash_at"):
            assert p.returncode == -9, errors[r][-3000:]  # the failpoint's SIGKILL
        else:
            assert p.returncode == 0, errors[r][-3000:]
            results[r] = json.loads((out / f"rank-{r}.json").read_text())
    return results


@pytest.fixture(scope="module")
def zero2(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """ZeRO-2, 2 ranks: an uninterrupted run; a run killed while saving step 6 (after
    saving step 4); the resumed run. Shared by the tests below."""
    root = tmp_path_factory.mktemp("zero2")
    common = {"stage": 2, "steps": 8}
    ref = _ranks(2, root / "o-ref", ckpt=str(root / "ref"), save_at=[4], **common)
    ckpt = root / "run"
    _ranks(2, root / "o-crash", ckpt=str(ckpt), save_at=[4], crash_at=6, **common)
    torn = sorted(p.name for p in ckpt.iterdir())
    resumed = _ranks(2, root / "o-resume", ckpt=str(ckpt), save_at=[], **common)
    return {"root": root, "ref": ref, "resumed": resumed, "torn": torn, "ckpt": ckpt}


def _same_run_after(resumed: dict[str, Any], ref: dict[str, Any], step: int) -> None:
    assert resumed["start"] == step and resumed["world"] == ref["world"]
    assert resumed["losses"] == {k: v for k, v in ref["losses"].items() if int(k) > step}
    assert resumed["checksum"] == ref["checksum"]


def test_killed_mid_save_resumes_from_the_last_published_checkpoint_bitwise(
    zero2: dict[str, Any],
) -> None:
    names = zero2["torn"]
    assert names[0].startswith(".tmp-ckpt-6-") and names[1:] == ["ckpt-0000000004"]
    for rank in (0, 1):
        _same_run_after(zero2["resumed"][rank]["first"], zero2["ref"][rank]["first"], 4)


def test_another_world_size_resumes_through_a_universal_checkpoint(
    zero2: dict[str, Any],
) -> None:
    root = zero2["root"]
    got = _ranks(3, root / "o-3", ckpt=str(zero2["ckpt"]), stage=2, steps=6, save_at=[6])
    runs = [r["first"] for r in got.values()]
    assert {r["start"] for r in runs} == {4} and {r["world"] for r in runs} == {3}
    assert len({r["checksum"] for r in runs}) == 1  # the ranks agree on the weights
    published = {p.name for p in zero2["ckpt"].iterdir()}
    assert {"ckpt-0000000004-1", "ckpt-0000000006"} <= published
    universal = json.loads((zero2["ckpt"] / "ckpt-0000000004-1" / MANIFEST_NAME).read_text())
    assert universal["metadata"]["universal"] is True
    assert universal["metadata"]["world_size"] == 2
    assert all(loss == loss for r in runs for loss in r["losses"].values())  # no NaN


@pytest.mark.parametrize("stage", [1, 3])
def test_zero_1_and_3_resume_bitwise_with_the_same_world_size(stage: int, tmp_path: Path) -> None:
    # one launch: train to 6 saving at 3, then a fresh engine restores step 3 and redoes 4-6
    got = _ranks(
        2,
        tmp_path / "o",
        ckpt=str(tmp_path / "c"),
        stage=stage,
        steps=6,
        save_at=[3],
        roundtrip=True,
    )
    for rank in (0, 1):
        _same_run_after(got[rank]["second"], got[rank]["first"], 3)


def test_the_process_group_is_destroyed_before_the_interpreter_exits() -> None:
    """build_engine registers close_process_group with atexit, once: it destroys the
    group, then sleeps with the GIL released so that gloo's worker threads finish
    before teardown (one that takes the GIL during teardown aborts the process)."""
    code = (
        "import atexit, time, torch, torch.distributed as dist\n"
        "from dlhpc.harness import deepspeed as dsh\n"
        "sleep = time.sleep\n"
        "def settle(s):\n"
        "    print('sleep', s, 'initialized:', dist.is_initialized())\n"
        "    sleep(s)\n"
        "time.sleep = settle\n"
        # registered first, so it runs after the harness's handler (atexit is LIFO)
        "atexit.register(lambda: print('initialized at exit:', dist.is_initialized()))\n"
        "model = torch.nn.Linear(4, 1)\n"
        "config = {'train_micro_batch_size_per_gpu': 1, 'steps_per_print': 10**9,\n"
        "          'optimizer': {'type': 'SGD', 'params': {'lr': 0.1}}}\n"
        "dsh.build_engine(None, model, config=config)\n"
        "dsh.build_engine(None, model, config=config)  # twice: one handler\n"
        "print('initialized after build:', dist.is_initialized())\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "DLHPC_"))}
    env |= {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "initialized after build: True" in out.stdout
    assert out.stdout.count("initialized at exit: False") == 1, out.stdout
    assert out.stdout.count(f"sleep {dsh.SETTLE_S} initialized: False") == 1, out.stdout
