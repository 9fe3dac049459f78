"""The Hugging Face Trainer adapter with real transformers (a tiny BERT from a config,
a word-level tokenizer built locally, nothing downloaded): the example trains as a
dlhpc job, resumes after a mid-epoch preemption with bitwise the same weights, stops
on the searcher's word, and owns the TrainingArguments fields dlhpc needs."""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import pytest

from dlhpc.errors import DlhpcError
from dlhpc.protocol import request_stop
from dlhpc.protocol.checkpoint import publish_checkpoint
from tests.unit._adapters import EXAMPLES, Trial, rank_outputs, require, state_dict_sha
from tests.unit.test_integration_lightning import added_lines

HP = {"lr": 0.003, "hidden": 16, "batch_size": 32, "step_sleep": 0.0}
STEPS_PER_EPOCH = 16  # 512 examples, batches of 32
EXAMPLE = EXAMPLES / "hf-trainer"
# The Trainer logs the mean training loss since its last log; that running sum is not
# in its checkpoint, so after a resume the first log covers only the steps since then.
RUNNING = {"loss", "train_loss"}
TIMINGS = ("_runtime", "_per_second")
RESUME_LINE = "trainer.train(resume_from_checkpoint=targs.resume_from_checkpoint)"


def bare_train_example(folder: Path) -> Path:
    """A copy of the example whose ``train.py`` calls ``trainer.train()`` bare: the
    three lines of ``train_plain_bare.py`` -> ``train.py`` without the fourth."""
    shutil.copytree(EXAMPLE, folder)
    script = folder / "train.py"
    text = script.read_text()
    assert text.count(RESUME_LINE) == 1
    script.write_text(text.replace(RESUME_LINE, "trainer.train()"))
    return folder


def _progress(t: Trial, attempt: int) -> dict[str, object]:
    body: dict[str, object] = json.loads(
        (t.trial_dir / "attempts" / str(attempt) / "progress.json").read_text()
    )
    return body


def _weights_sha(checkpoint_dir: Path) -> str:
    from safetensors.torch import load_file

    from dlhpc.protocol.checkpoint import latest_verified

    ckpt, _ = latest_verified(checkpoint_dir)
    assert ckpt is not None
    return state_dict_sha(load_file(ckpt.path / "model.safetensors"))


def _deterministic(metrics: dict[int, dict[str, float]]) -> dict[int, dict[str, float]]:
    return {
        step: {k: v for k, v in m.items() if k not in RUNNING and not k.endswith(TIMINGS)}
        for step, m in metrics.items()
    }


def term_at_step_ends(folder: Path, steps: tuple[int, ...]) -> Path:
    """A copy of the example whose process sends itself TERM at the end of each of
    ``steps``, just before the callback looks: a preemption landing exactly there."""
    shutil.copytree(EXAMPLE, folder)
    (folder / "train.py").rename(folder / "example.py")
    (folder / "train.py").write_text(
        "import os, runpy, signal\n"
        "from dlhpc.integrations.transformers import DlhpcCallback\n"
        "step_end = DlhpcCallback.on_step_end\n"
        "def term_first(self, args, state, control, **kw):\n"
        f"    if state.global_step in {steps!r}:\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "    step_end(self, args, state, control, **kw)\n"
        "DlhpcCallback.on_step_end = term_first\n"
        "runpy.run_path('example.py', run_name='__main__')\n"
    )
    return folder


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Trial:
    """The example trained 3 epochs in one go (``HP``, seed 7): what preempted runs end as."""
    require("transformers", "transformers", "accelerate", "tokenizers")
    ref = Trial(tmp_path_factory.mktemp("ref"), "hf-trainer", HP)
    code, out = ref.run(3)
    assert code == 0, out
    return ref


def test_preempted_mid_epoch_trial_ends_bitwise_as_one_run(
    tmp_path: Path, reference: Trial
) -> None:
    ref = reference
    assert ref.checkpoints() == [f"ckpt-{STEPS_PER_EPOCH * e:010d}" for e in (1, 2, 3)]
    expected = ref.metrics()
    assert sorted(expected) == [1, 2, 3]
    assert {"eval_loss", "eval_accuracy", "loss", "learning_rate"} <= set(expected[3])

    t = Trial(tmp_path / "t", "hf-trainer", HP)
    first = f"ckpt-{STEPS_PER_EPOCH:010d}"
    code, out = t.run_until(3, lambda: first in t.checkpoints(), step_sleep=0.2)
    assert code == 75, out
    (mid,) = [c for c in t.checkpoints() if c != first]  # saved where TERM found it
    step = int(mid.removeprefix("ckpt-"))
    assert STEPS_PER_EPOCH < step < 2 * STEPS_PER_EPOCH, mid
    code, out = t.run(3)
    assert code == 0 and f"resumed at step {step} from {mid}" in out, out
    assert "warning" not in out and _progress(t, 1)["start_step"] == step, out
    assert _weights_sha(t.checkpoint_dir) == _weights_sha(ref.checkpoint_dir)
    got = t.metrics()
    assert _deterministic(got) == _deterministic(expected)  # eval metrics, learning rate...
    assert got[1]["loss"] == expected[1]["loss"] and got[3]["loss"] == expected[3]["loss"]
    assert got[2]["loss"] != expected[2]["loss"]  # the window the resume cut (see RUNNING)
    assert sorted(e["step"] for e in t.events("checkpoint")) == [16, step, 32, 48]
    assert not list((t.checkpoint_dir / "hf-output").glob("checkpoint-*"))  # all moved


def test_preempted_at_epoch_ends_saves_after_the_evaluation_and_ends_bitwise(
    tmp_path: Path, reference: Trial
) -> None:
    """TERM seen at an epoch's last step: the save waits for the epoch's log and
    evaluation, as in one run. The evaluation draws from the RNG whose state the
    checkpoint holds (a save before it resumed the next epoch with other dropout
    masks), and the last epoch's evaluation is not skipped."""
    last = 3 * STEPS_PER_EPOCH
    t = Trial(tmp_path, str(term_at_step_ends(tmp_path / "ex", (STEPS_PER_EPOCH, last))), HP)
    code, out = t.run(3)
    assert code == 75 and t.checkpoints() == [f"ckpt-{STEPS_PER_EPOCH:010d}"], out
    code, out = t.run(3)  # TERM again, at the last step
    assert code == 75 and t.checkpoints()[-1] == f"ckpt-{last:010d}", out
    code, out = t.run(3)
    assert code == 0 and f"resumed at step {last} from ckpt-{last:010d}" in out, out
    assert _weights_sha(t.checkpoint_dir) == _weights_sha(reference.checkpoint_dir)
    got, expected = t.metrics(), reference.metrics()
    assert _deterministic(got) == _deterministic(expected)  # eval metrics of every epoch
    assert [got[e]["loss"] for e in (1, 2, 3)] == [expected[e]["loss"] for e in (1, 2, 3)]


def test_bare_train_is_not_reported_as_resumed_and_says_which_line_to_add(
    tmp_path: Path,
) -> None:
    """A script that calls ``trainer.train()`` bare: the Trainer cannot resume, so the
    next attempt starts at step 0 though a checkpoint exists. No "resumed at step"; a
    warning (output and the trial's records) names the line to add, and the progress
    file says where training started, from which the reconciler counts the lost steps."""
    require("transformers", "transformers", "accelerate", "tokenizers")
    t = Trial(tmp_path / "t", str(bare_train_example(tmp_path / "bare")), HP)
    code, out = t.run(1)  # paused at its grant: one epoch, one checkpoint
    assert code == 0, out
    assert t.checkpoints() == [f"ckpt-{STEPS_PER_EPOCH:010d}"]
    code, out = t.run(2)  # the promotion's attempt: should resume at step 16
    assert code == 0, out
    assert "resumed at step" not in out, out
    assert f"the Trainer started at step 0, not from checkpoint ckpt-{STEPS_PER_EPOCH:010d}" in out
    line = "trainer.train(resume_from_checkpoint=trainer.args.resume_from_checkpoint)"
    (warning,) = [e for e in t.events("log") if e["level"] == "warning"]
    assert line in warning["message"] and f"its {STEPS_PER_EPOCH} steps" in warning["message"]
    assert _progress(t, 0)["start_step"] == _progress(t, 1)["start_step"] == 0
    # trained again from scratch: the first epoch's checkpoint a second time, then the second
    assert sorted(e["step"] for e in t.events("checkpoint")) == [16, 16, 32]


def test_stop_file_saves_and_ends_the_trial_with_75(tmp_path: Path) -> None:
    require("transformers", "transformers", "accelerate", "tokenizers")
    t = Trial(tmp_path, "hf-trainer", HP)

    def stop_after_first_epoch() -> bool:
        if t.checkpoints():
            request_stop(t.trial_dir)  # what the reconciler writes for the searcher
            return True
        return False

    code, out = t.run_until(6, stop_after_first_epoch, sig=0, step_sleep=0.2)
    assert code == 75, out
    assert len(t.checkpoints()) == 2 and 1 <= len(t.metrics()) < 6


def test_training_args_owns_length_output_save_and_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require("transformers", "transformers", "accelerate")
    from transformers import TrainingArguments
    from transformers.trainer_utils import SaveStrategy

    import dlhpc
    from dlhpc.integrations.transformers import training_args

    t = Trial(tmp_path, "hf-trainer", HP)
    t.trial_dir.mkdir()
    t._spec(4)
    monkeypatch.setenv("DLHPC_TRIAL_DIR", str(t.trial_dir))
    monkeypatch.delenv("DLHPC_ATTEMPT_DIR", raising=False)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR2)}
    try:
        ctx = dlhpc.init()
        args = TrainingArguments(output_dir=str(tmp_path / "x"), save_strategy="no")
        assert training_args(args, ctx=ctx) is args
        assert args.output_dir == str(t.checkpoint_dir / "hf-output")
        assert (args.num_train_epochs, args.max_steps) == (4.0, -1)
        assert args.save_strategy == SaveStrategy.EPOCH and args.resume_from_checkpoint is None

        def write(folder: Path) -> None:
            (folder / "x").write_text("1")

        good = publish_checkpoint(t.checkpoint_dir, 7, write)
        (t.checkpoint_dir / "ckpt-0000000009").mkdir()  # torn: no manifest
        stale = t.checkpoint_dir / "hf-output" / "checkpoint-9"
        stale.mkdir(parents=True)
        steps = TrainingArguments(output_dir="y")
        training_args(steps, unit="steps", ctx=ctx)
        assert steps.max_steps == 4 and steps.save_strategy == SaveStrategy.STEPS
        assert steps.resume_from_checkpoint == str(good.path) and not stale.exists()

        best = TrainingArguments(
            output_dir="z",
            load_best_model_at_end=True,
            eval_strategy="epoch",
            save_strategy="epoch",
        )
        with pytest.raises(DlhpcError, match="load_best_model_at_end"):
            training_args(best, ctx=ctx)
        with pytest.raises(DlhpcError, match="unit"):
            training_args(args, unit="tokens", ctx=ctx)
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)


def test_example_adds_at_most_three_lines_as_its_readme_says() -> None:
    added = added_lines("hf-trainer")
    assert added <= 3
    readme = EXAMPLE / "README.md"
    assert f"**Lines you add: {added}**" in readme.read_text()


def test_ddp_term_on_one_rank_saves_every_ranks_part_and_both_resume(tmp_path: Path) -> None:
    """Two ranks (gloo, CPU) as dlhpc's worker starts them: a TERM only rank 1 gets
    stops both at the same step; the published folder holds both ranks' RNG states."""
    require("transformers", "transformers", "accelerate", "tokenizers")
    import sys
    import time

    t = Trial(tmp_path, "hf-trainer", HP)
    first = f"ckpt-{STEPS_PER_EPOCH // 2:010d}"  # 2 ranks: 8 steps per epoch
    procs = t.start_ranks(3, [sys.executable, "train.py"], step_sleep=0.2)
    deadline = time.monotonic() + 240
    while first not in t.checkpoints():
        assert all(p.poll() is None for p in procs) and time.monotonic() < deadline
        time.sleep(0.1)
    procs[1].send_signal(signal.SIGTERM)
    outs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [75, 75], rank_outputs(procs, outs)
    (mid,) = [c for c in t.checkpoints() if c != first]
    assert {"rng_state_0.pth", "rng_state_1.pth"} <= {
        p.name for p in (t.checkpoint_dir / mid).iterdir()
    }
    procs = t.start_ranks(3, [sys.executable, "train.py"])
    outs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], rank_outputs(procs, outs)
    resumed = f"resumed at step {int(mid[5:])} from {mid}"
    assert all(resumed in out for out in outs), rank_outputs(procs, outs)
    assert t.checkpoints()[-1] == f"ckpt-{3 * STEPS_PER_EPOCH // 2:010d}"


def test_one_rank_job_destroys_the_trainers_gloo_group_at_exit(tmp_path: Path) -> None:
    """A one-rank job (dlhpc's worker sets RANK, WORLD_SIZE=1, LOCAL_RANK): the Trainer
    starts a gloo group, which the callback destroys at exit (a live group can abort
    the interpreter's finalization, turning a finished attempt into a crash)."""
    require("transformers", "transformers", "accelerate", "tokenizers")
    import sys

    wrapper = tmp_path / "wrapper.py"
    wrapper.write_text(
        "import atexit, runpy, sys\n"
        "import torch.distributed as dist\n"
        "atexit.register(lambda: print('at exit, group alive:', dist.is_initialized()))\n"
        "sys.argv = ['train.py']\n"
        "runpy.run_path('train.py', run_name='__main__')\n"
        "print('after training, group alive:', dist.is_initialized())\n"
    )
    t = Trial(tmp_path, "hf-trainer", HP)
    (proc,) = t.start_ranks(1, [sys.executable, str(wrapper)], ranks=1)
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out
    assert "after training, group alive: True" in out, out  # the Trainer started one
    assert "at exit, group alive: False" in out, out  # registered first, runs last
