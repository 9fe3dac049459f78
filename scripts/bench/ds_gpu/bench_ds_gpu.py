#!/usr/bin/env python3
"""DeepSpeed under dlhpc on one GPU: validation, throughput, telemetry. JSON out.

    python scripts/bench/ds_gpu/bench_ds_gpu.py validate --out DIR  # the example, worker
    python scripts/bench/ds_gpu/bench_ds_gpu.py bench --out DIR     # tokens/s, +/- harness

Both run without Slurm, the way the local backend does: a trial folder (``trial.json``,
``entry.sh``, a copy of ``templates/examples/deepspeed-lm`` as the code snapshot) run by
``python -m dlhpc.harness.worker TRIAL_DIR`` with ``DLHPC_JOB_ID`` set and the rank variables
of a world of one (``MASTER_ADDR=127.0.0.1``, a free port). With a GPU the DeepSpeed config
is the example's ``ds_config.json`` (ZeRO-2) with ``bf16`` enabled (``--no-bf16``: as is).

``validate``: the example trains ``--steps`` steps uninterrupted (reference); another trial
is SIGTERMed through its worker ``--term-after`` seconds after its engine is up (the harness
checkpoints and exits 75), then run again (restart 1) and resumes. Once with
``reproducibility.deterministic`` (``torch.use_deterministic_algorithms``) and once
without. Reports the rank line (backend, device, dtype), exit codes, the step the resumed
attempt restored, and the differences between the two ``final.json`` (losses, weights hash).

``bench``: the example's model, one process per run, runs interleaved (plain, harness; then
harness, plain; ...), ``--reps`` of each, for the ``--settings`` (``small``: the example's
size; ``large``: wider, longer context, bigger batch, DeepSpeed's default ZeRO buckets;
``large-ex``: the same with the example's small buckets). ``plain`` is a DeepSpeed loop with
no dlhpc call (``deepspeed.initialize`` directly, ``engine.save_checkpoint`` every ``ckpt_every``
timed steps); ``harness`` is the same loop under the worker with ``dlhpc.init``,
``dsh.build_engine``, ``dsh.engine_state``, ``ctx.report`` every step, ``dsh.step`` every
step and ``ctx.checkpoint`` every ``ckpt_every`` timed steps. Both call ``loss.item()`` every
step. Warm-up steps are not timed; tokens/s is given with and without the checkpoints' time.
The worker's NVML sampler (5 s) writes ``gpu`` records into each harness attempt folder;
their utilization is summarised inside and outside the timed window.

``loop`` is one such run (called by ``bench``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "templates" / "examples" / "deepspeed-lm"
HERE = Path(__file__).resolve()
if str(REPO) not in sys.path:  # dlhpc from this checkout when it is not installed
    sys.path.insert(0, str(REPO))

SETTINGS: dict[str, dict[str, int]] = {
    # the example's model (experiment.yaml) and micro-batch (ds_config.json)
    "small": {"layers": 2, "d_model": 64, "heads": 4, "context": 32, "micro": 8},
    "large": {"layers": 8, "d_model": 1024, "heads": 16, "context": 512, "micro": 32},
}
SETTINGS["large-ex"] = SETTINGS["large"]
RUN_SHAPE: dict[str, dict[str, int]] = {  # warm-up and timed steps, checkpoint cadence
    "small": {"warmup": 30, "steps": 300, "ckpt_every": 150},
    "large": {"warmup": 10, "steps": 150, "ckpt_every": 75},
    "large-ex": {"warmup": 10, "steps": 150, "ckpt_every": 75},
}
# ZeRO-2 buckets: the example's 5e5 elements make ~200 reductions a step for the large
# model (Python-bound, the GPU half idle); "large" uses DeepSpeed's default 5e8, "large-ex"
# keeps the example's.
BUCKETS: dict[str, int] = {"large": 500_000_000}


def ds_config(micro: int, bf16: bool, buckets: int | None = None) -> dict[str, Any]:
    """The example's ZeRO-2 config with ``bf16`` on (a GPU variant), this micro-batch and
    optionally other bucket sizes."""
    cfg: dict[str, Any] = json.loads((EXAMPLE / "ds_config.json").read_text(encoding="utf-8"))
    cfg["train_micro_batch_size_per_gpu"] = micro
    cfg["bf16"] = {"enabled": bf16}
    if buckets:
        cfg["zero_optimization"] |= {"reduce_bucket_size": buckets}
        cfg["zero_optimization"] |= {"allgather_bucket_size": buckets}
    return cfg


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment without Slurm/dlhpc variables, plus a world of one and dlhpc on
    PYTHONPATH (kept: wheels carried to /tmp/site)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "DLHPC_"))}
    path = [str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env |= {"PYTHONPATH": os.pathsep.join(path), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    env |= {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
    env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    return env | (extra or {})


def make_trial(
    root: Path,
    hparams: dict[str, Any],
    config: dict[str, Any],
    max_length: int,
    deterministic: bool,
    command: str,
) -> Path:
    """A trial folder as ``dlhpc launch`` writes one: trial.json, entry.sh, code/."""
    from dlhpc.protocol import TrialSpec

    code = root / "code"
    shutil.copytree(EXAMPLE, code)
    entry = root / "entry.sh"
    entry.write_text(f"#!/bin/bash\ntrap ':' TERM USR2 INT\n{command}\n", encoding="utf-8")
    trial = root / "trial"
    trial.mkdir(parents=True)
    TrialSpec(
        experiment_id=1,
        trial_id=1,
        hparams=hparams,
        max_length=max_length,
        seed=1,
        experiment_dir=str(root),
        code_dir=str(code),
        entry_script=str(entry),
        checkpoint_dir=str(trial / "checkpoints"),
        metric="val_loss",
        smaller_is_better=True,
        keep_latest=1,
        deterministic=deterministic,
        deepspeed=config,
    ).write(trial / "trial.json")
    return trial


def run_worker(
    trial: Path,
    log: Path,
    job_id: str,
    restart: int = 0,
    term_after: float | None = None,
    timeout: float = 300.0,
) -> dict[str, Any]:
    """Run the trial once through the worker; with ``term_after``, SIGTERM the worker that
    many seconds after the example printed its rank line (its engine is up)."""
    env = rank_env({"DLHPC_JOB_ID": job_id, "DLHPC_RESTART": str(restart)})
    argv = [sys.executable, "-m", "dlhpc.harness.worker", str(trial)]
    started = time.monotonic()
    engine_up: list[float] = []
    with log.open("w", encoding="utf-8") as out:
        proc = subprocess.Popen(
            argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert proc.stdout is not None
        timer: threading.Timer | None = None
        for line in proc.stdout:
            out.write(line)
            if term_after is not None and not engine_up and line.startswith("[deepspeed-lm] {"):
                engine_up.append(time.monotonic() - started)
                timer = threading.Timer(term_after, proc.send_signal, (signal.SIGTERM,))
                timer.start()
        code = proc.wait(timeout=timeout)
        if timer is not None:
            timer.cancel()
    return {
        "rc": code,
        "wall_s": round(time.monotonic() - started, 2),
        "engine_up_s": round(engine_up[0], 2) if engine_up else None,
    }


def attempt_records(attempt: Path, prefix: str) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    for path in sorted(attempt.glob(f"{prefix}-*.jsonl")):
        records += [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x]
    return records


def gpu_summary(attempt: Path, window: tuple[float, float] | None = None) -> dict[str, Any]:
    """The ``gpu`` records of an attempt: count, utilization in and out of ``window``."""
    recs = [r for r in attempt_records(attempt, "gpu-n0") if r.get("type") == "gpu"]
    inside: list[int | None] = []
    outside: list[int | None] = []
    power: list[float | None] = []
    mem: list[int | None] = []
    for r in recs:
        for g in r["gpus"]:
            hit = window is not None and window[0] <= r["time"] <= window[1]
            (inside if hit else outside).append(g["util"])
            if hit:
                power.append(g["power_w"])
                mem.append(g["mem_used"])
    return {
        "samples": len(recs),
        "util_in_window": inside,
        "util_outside_window": outside,
        "power_w_in_window": [round(p, 1) for p in power if p is not None],
        "mem_used_gib_in_window": [round(m / 2**30, 2) for m in mem if m is not None],
    }


def rank_line(log: Path) -> dict[str, Any] | None:
    for line in log.read_text(encoding="utf-8").splitlines():
        if line.startswith("[deepspeed-lm] {"):
            return json.loads(line.removeprefix("[deepspeed-lm] "))  # type: ignore[no-any-return]
    return None


def restored_lines(log: Path) -> list[str]:
    return [x for x in log.read_text(encoding="utf-8").splitlines() if "restored ckpt-" in x]


def versions() -> dict[str, Any]:
    import torch

    got: dict[str, Any] = {"python": sys.version.split()[0], "torch": torch.__version__}
    got["cuda"] = torch.version.cuda
    if torch.cuda.is_available():
        got["gpu"] = torch.cuda.get_device_name(0)
        got["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))  # type: ignore[no-untyped-call]
    try:
        import deepspeed

        got["deepspeed"] = deepspeed.__version__
    except Exception as err:  # noqa: BLE001 - reported, not raised
        got["deepspeed"] = f"{type(err).__name__}: {err}"
    try:
        import pynvml

        pynvml.nvmlInit()
        got["driver"] = pynvml.nvmlSystemGetDriverVersion()
    except Exception as err:  # noqa: BLE001
        got["driver"] = f"{type(err).__name__}: {err}"
    return got


def use_bf16(args: argparse.Namespace) -> bool:
    import torch

    return bool(torch.cuda.is_available() and not args.no_bf16)


# -- validate ----------------------------------------------------------------------


def cmd_validate(args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work)
    bf16 = use_bf16(args)
    hp = {"layers": 2, "d_model": 64, "heads": 4, "context": 32, "log_every": 10}
    hp |= {"eval_every": 100, "ckpt_every": 100, "step_sleep": args.step_sleep}
    config = ds_config(8, bf16)
    result: dict[str, Any] = {"versions": versions(), "ds_config": config, "hparams": hp}
    result["steps"] = args.steps
    command = f'"{sys.executable}" train.py'
    for det in (True, False):
        name = "det" if det else "nondet"
        ref = make_trial(work / f"ref-{name}", hp, config, args.steps, det, command)
        got: dict[str, Any] = {"reference": run_worker(ref, out / f"ref-{name}.log", "ref")}
        got["reference"]["rank_line"] = rank_line(out / f"ref-{name}.log")
        res = make_trial(work / f"res-{name}", hp, config, args.steps, det, command)
        first = run_worker(res, out / f"term-{name}.log", "res", 0, term_after=args.term_after)
        exits = attempt_records(res / "attempts" / "res.r0", "worker-r0")
        first["exit_record"] = next((r for r in exits if r["type"] == "exit"), None)
        first["rank_line"] = rank_line(out / f"term-{name}.log")
        second = run_worker(res, out / f"resume-{name}.log", "res", 1)
        second["restored"] = restored_lines(out / f"resume-{name}.log")
        got |= {"terminated": first, "resumed": second}
        finals: list[dict[str, Any] | None] = []
        for trial in (ref, res):
            path = trial / "checkpoints" / "final.json"
            finals.append(json.loads(path.read_text()) if path.is_file() else None)
        got["final_reference"], got["final_resumed"] = finals
        a, b = finals
        if a is not None and b is not None:
            got["diff"] = {
                "val_loss_abs": abs(a["val_loss"] - b["val_loss"]),
                "train_loss_abs": abs(a["train_loss"] - b["train_loss"]),
                "weights_equal": a["weights_sha256"] == b["weights_sha256"],
                "bitwise_equal": a == b,
            }
        got["gpu_telemetry_reference"] = gpu_summary(ref / "attempts" / "ref.r0")
        result[name] = got
        print(json.dumps({name: got.get("diff"), "rcs": [first["rc"], second["rc"]]}), flush=True)
    return result


# -- bench -------------------------------------------------------------------------


def cmd_loop(args: argparse.Namespace) -> None:
    """One timed run (a child of ``bench``); writes its JSON to ``--result``."""
    import torch
    import torch.nn.functional as F

    t_start = time.time()
    cuda = torch.cuda.is_available()

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    sys.path.insert(0, str(EXAMPLE))
    import train as lm  # the example's model and batches

    shape = json.loads(args.shape)
    hp, run = shape["hparams"], shape["run"]
    warmup, steps, ckpt_every = run["warmup"], run["steps"], run["ckpt_every"]
    harness = args.mode == "harness"
    train, _, vocab = lm.load_text()
    torch.manual_seed(1)
    model = lm.CharLM(vocab, hp["d_model"], hp["heads"], hp["layers"], hp["context"])
    ckpt_dir = Path(args.ckpt_dir)
    if harness:
        import dlhpc
        from dlhpc.harness import deepspeed as dsh

        ctx = dlhpc.init()
        engine = dsh.build_engine(ctx, model)
        state = dsh.engine_state(ctx, engine)
        state.restore()
    else:  # a plain DeepSpeed script: no dlhpc call
        if cuda:
            torch.cuda.set_device(0)
        else:
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        import deepspeed

        backend = "nccl" if cuda else "gloo"
        deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False, verbose=False)
        config = json.loads(args.config)
        params = [p for p in model.parameters() if p.requires_grad]
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params, config=config)
    import torch.distributed as dist

    micro, context = engine.train_micro_batch_size_per_gpu(), hp["context"]
    losses: list[float] = []
    ckpt_s: list[float] = []
    t0 = t0_wall = 0.0
    t_first = time.time()
    for step in range(1, warmup + steps + 1):
        if step == warmup + 1:
            sync()
            t0, t0_wall = time.perf_counter(), time.time()
        x, y = (t.to(engine.device) for t in lm.batch(train, micro, context, step))
        loss = F.cross_entropy(engine(x).flatten(0, 1), y.flatten())
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
        timed = step - warmup
        save = timed > 0 and timed % ckpt_every == 0
        if harness:
            state.step = step
            ctx.report(step, {"train_loss": losses[-1]})
            if save:
                c = time.perf_counter()
                ctx.checkpoint(state)
                ckpt_s.append(time.perf_counter() - c)
            dsh.step(ctx, state)
        elif save:
            sync()
            c = time.perf_counter()
            engine.save_checkpoint(str(ckpt_dir), tag=f"step{step}")
            ckpt_s.append(time.perf_counter() - c)
            for old in ckpt_dir.glob("step*"):
                if old.name != f"step{step}":
                    shutil.rmtree(old, ignore_errors=True)
    sync()
    elapsed = time.perf_counter() - t0
    t1_wall = time.time()
    tokens = steps * micro * context
    result = {
        "mode": args.mode,
        "tokens_per_step": micro * context,
        "timed_steps": steps,
        "elapsed_s": elapsed,
        "ckpt_s": ckpt_s,
        "tokens_per_s": tokens / elapsed,
        "tokens_per_s_without_ckpt": tokens / (elapsed - sum(ckpt_s)),
        "ms_per_step_without_ckpt": 1000 * (elapsed - sum(ckpt_s)) / steps,
        "startup_s": t_first - t_start,
        "window": [t0_wall, t1_wall],
        "loss_first_last": [losses[0], losses[-1]],
        "backend": dist.get_backend(),
        "device": str(engine.device),
        "dtype": str(next(engine.module.parameters()).dtype),
        "params": sum(p.numel() for p in engine.module.parameters()),
        "max_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
    }
    Path(args.result).write_text(json.dumps(result), encoding="utf-8")
    if harness:
        ctx.close()


def bench_run(
    work: Path, out: Path, setting: str, mode: str, rep: int, bf16: bool
) -> dict[str, Any]:
    hp, run = dict(SETTINGS[setting]), dict(RUN_SHAPE[setting])
    config = ds_config(hp["micro"], bf16, BUCKETS.get(setting))
    shape = json.dumps({"hparams": hp, "run": run})
    root = work / f"{setting}-{mode}-{rep}"
    root.mkdir(parents=True)
    result, log = root / "result.json", out / f"bench-{setting}-{mode}-{rep}.log"
    loop = [sys.executable, str(HERE), "loop", "--mode", mode, "--shape", shape]
    loop += ["--result", str(result), "--ckpt-dir", str(root / "plain-ckpt")]
    t = time.monotonic()
    if mode == "plain":
        loop += ["--config", json.dumps(config)]
        with log.open("w", encoding="utf-8") as f:
            rc = subprocess.run(
                loop, cwd=REPO, env=rank_env(), stdout=f, stderr=subprocess.STDOUT, check=False
            ).returncode
        attempt = None
    else:
        command = " ".join(f"'{a}'" for a in loop)
        trial = make_trial(root, {**hp, "max_length": 1}, config, 1, False, command)
        rc = run_worker(trial, log, "bench")["rc"]
        attempt = trial / "attempts" / "bench.r0"
    got: dict[str, Any] = {"setting": setting, "mode": mode, "rep": rep, "rc": rc}
    got["process_wall_s"] = round(time.monotonic() - t, 2)
    if result.is_file():
        got |= json.loads(result.read_text())
        if attempt is not None:
            window = (float(got["window"][0]), float(got["window"][1]))
            got["gpu"] = gpu_summary(attempt, window)
    shutil.rmtree(root / "plain-ckpt", ignore_errors=True)
    shutil.rmtree(root / "trial" / "checkpoints", ignore_errors=True)
    print(
        json.dumps({k: got.get(k) for k in ("setting", "mode", "rep", "rc", "tokens_per_s")}),
        flush=True,
    )
    return got


def cmd_bench(args: argparse.Namespace) -> dict[str, Any]:
    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    bf16 = use_bf16(args)
    settings = args.settings.split(",")
    runs: list[dict[str, Any]] = []
    for rep in range(args.reps):
        for setting in settings:
            order = ("plain", "harness") if rep % 2 == 0 else ("harness", "plain")
            runs += [bench_run(work, out, setting, mode, rep, bf16) for mode in order]
    summary: dict[str, Any] = {}
    for setting in settings:
        row: dict[str, Any] = {"hparams": SETTINGS[setting], "run": RUN_SHAPE[setting]}
        row["zero_buckets"] = BUCKETS.get(setting, "example's (5e5)")
        for mode in ("plain", "harness"):
            ok = [r for r in runs if r["setting"] == setting and r["mode"] == mode and r["rc"] == 0]
            ok = [r for r in ok if "tokens_per_s" in r]
            row[mode] = {
                "runs": len(ok),
                "tokens_per_s": [round(r["tokens_per_s"]) for r in ok],
                "median_tokens_per_s": statistics.median(r["tokens_per_s"] for r in ok)
                if ok
                else None,
                "median_tokens_per_s_without_ckpt": statistics.median(
                    r["tokens_per_s_without_ckpt"] for r in ok
                )
                if ok
                else None,
                "median_ms_per_step_without_ckpt": statistics.median(
                    r["ms_per_step_without_ckpt"] for r in ok
                )
                if ok
                else None,
                "ckpt_s": [round(c, 3) for r in ok for c in r["ckpt_s"]],
            }
        p, h = row["plain"], row["harness"]
        if p["median_tokens_per_s"] and h["median_tokens_per_s"]:
            row["ratio_harness_over_plain"] = h["median_tokens_per_s"] / p["median_tokens_per_s"]
            row["ratio_without_ckpt"] = (
                h["median_tokens_per_s_without_ckpt"] / p["median_tokens_per_s_without_ckpt"]
            )
        summary[setting] = row
    return {"versions": versions(), "bf16": bf16, "summary": summary, "runs": runs}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("validate")
    b = sub.add_parser("bench")
    for p in (v, b):
        p.add_argument("--out", required=True, help="logs and the JSON summary go here")
        p.add_argument("--work", default="/tmp/dlhpc-ds-gpu", help="trial folders (emptied)")
        p.add_argument("--no-bf16", action="store_true", help="keep the example's fp32")
    v.add_argument("--steps", type=int, default=300)
    v.add_argument("--step-sleep", type=float, default=0.02)
    v.add_argument("--term-after", type=float, default=3.0)
    b.add_argument("--reps", type=int, default=3)
    b.add_argument("--settings", default="small,large")
    lp = sub.add_parser("loop")
    lp.add_argument("--mode", choices=("plain", "harness"), required=True)
    lp.add_argument("--shape", required=True)
    lp.add_argument("--config", default="{}")
    lp.add_argument("--result", required=True)
    lp.add_argument("--ckpt-dir", required=True)
    args = parser.parse_args()
    if args.cmd == "loop":
        cmd_loop(args)
        return 0
    shutil.rmtree(args.work, ignore_errors=True)
    result = cmd_validate(args) if args.cmd == "validate" else cmd_bench(args)
    text = json.dumps(result, indent=1)
    (Path(args.out) / f"{args.cmd}.json").write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
