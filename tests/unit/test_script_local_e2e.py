"""A plain script (no dlhpc import) through the real CLI, worker and entry.sh, locally.

The local backend runs the same worker and entry.sh as Slurm jobs: the template's
values arrive as argv items (a hostile categorical value included), the metrics
come from the stdout pattern and the JSON-lines file, an ASHA promotion resumes the
script from its registered checkpoint, and the example's two scripts are one file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit._cli import local_exp_dir, run, until_over

REPO = Path(__file__).resolve().parents[2]
EVIL = "a b; $(touch PWNED) `touch PWNED2` 'q'"

TRAIN = r"""
import argparse, json, os, sys
p = argparse.ArgumentParser()
p.add_argument("--x", type=float)
p.add_argument("--tag")
p.add_argument("--epochs", type=int)
p.add_argument("--ckpt-dir")
p.add_argument("--resume", default="")
a = p.parse_args()
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "argv.jsonl"), "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\n")
start = json.load(open(a.resume))["epoch"] if a.resume else 0
for epoch in range(start + 1, a.epochs + 1):
    print(f"epoch {epoch} loss={a.x / epoch!r}", flush=True)
    with open(os.environ["DLHPC_METRICS_FILE"], "a") as f:
        f.write(json.dumps({"step": epoch, "score": a.x * epoch}) + "\n")
    tmp = os.path.join(a.ckpt_dir, ".tmp")
    with open(tmp, "w") as f:
        json.dump({"epoch": epoch}, f)
    os.replace(tmp, os.path.join(a.ckpt_dir, f"epoch-{epoch}.json"))
"""


@pytest.fixture
def exp_dir(tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return local_exp_dir(tmp_path, monkeypatch, train=TRAIN)


def test_plain_script_under_asha_on_the_local_backend(
    exp_dir: Path, home: Path, tmp_path: Path
) -> None:
    (exp_dir / "exp.yaml").write_text(
        "name: local-plain\n"
        "entrypoint: python train.py --x={x} --tag {tag} --epochs {max_length}"
        " --ckpt-dir {checkpoint_dir} --resume {checkpoint}\n"
        "hyperparameters:\n"
        "  x: {type: categorical, vals: [0.5, 1.0]}\n"
        f"  tag: {{type: categorical, vals: [{json.dumps(EVIL)}]}}\n"
        "searcher: {name: asha, metric: loss, max_trials: 2, max_length: 4, divisor: 2,"
        " max_rungs: 2, max_concurrent_trials: 2, seed: 1}\n"
        "script:\n  metrics: {pattern: 'epoch (?P<step>\\d+) loss=(?P<loss>\\S+)'}\n"
    )
    res = run("launch", str(exp_dir / "exp.yaml"), "--json")
    assert res.exit_code == 0, res.output
    exp = until_over(json.loads(res.output)["experiment_id"], timeout=240)
    assert exp["state"] == "COMPLETED", exp
    states = sorted(t["state"] for t in exp["trials"])
    assert states == ["COMPLETED", "STOPPED_EARLY"], exp
    (best,) = [t for t in exp["trials"] if t["state"] == "COMPLETED"]
    assert best["steps_completed"] == 4
    assert best["best_metric"] == pytest.approx(best["hparams"]["x"] / 4)
    # argv.jsonl beside the script's path: in each trial's working folder, one line per
    # run of the script; none in the read-only code snapshot
    (code,) = home.glob("runs/exp-*/code")
    assert not (code / "argv.jsonl").exists()
    logs = sorted(home.glob("runs/exp-*/trials/trial-*/work/argv.jsonl"))
    assert len(logs) == 2, logs
    argvs = [json.loads(line) for log in logs for line in log.read_text().splitlines()]
    assert len(argvs) == 3  # two first runs, one promoted run resumed from epoch 2
    assert all(argv[1:3] == ["--tag", EVIL] for argv in argvs)
    resumed = [argv for argv in argvs if argv[-1]]
    assert len(resumed) == 1 and resumed[0][-1].endswith("/epoch-2.json"), resumed
    assert not list(tmp_path.rglob("PWNED*"))


def test_the_argparse_example_is_its_plain_script_unchanged() -> None:
    example = REPO / "templates" / "examples" / "argparse"
    assert (example / "train.py").read_bytes() == (example / "train_plain.py").read_bytes()
