"""Hostile values (shell metacharacters, quotes, newlines, unicode, leading '-') in
hyperparameters, environment variables, entrypoint arguments and paths reach the
trial on the real dev cluster exactly as given, and run nothing.

Each value that would run a command if a shell ever evaluated it touches a file
under the test's own sentinel folder (or, inside path names, where no '/' fits, a
relative name with a unique token, looked for in every folder a shell could have
been running in); none may exist afterwards.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from dlhpc.config import name_slug
from dlhpc.config.schema import PreemptionConfig, Resources, SiteConfig
from dlhpc.protocol import experiment_dir_name, recorded_slug, trial_dir
from dlhpc.scheduler import JobRequest, SlurmScheduler
from tests.integration.conftest import REPO, Cli
from tests.unit._cli import run

pytestmark = pytest.mark.cluster

PROBE = """\
import json, os, sys
import dlhpc

ctx = dlhpc.init()
spec = json.load(open(os.path.join(os.environ["DLHPC_TRIAL_DIR"], "trial.json")))
got = {
    "argv": sys.argv[1:],
    "hparams": ctx.hparams,
    "env": {k: os.environ.get(k) for k in json.loads(os.environ["PROBE_KEYS"])},
    "data": [d["path"] for d in spec["data"]],
    "checkpoint_dir": spec["checkpoint_dir"],
    "cwd_files": sorted(os.listdir(".")),
}
with open(os.environ["PROBE_OUT"], "w", encoding="utf-8") as f:
    json.dump(got, f, ensure_ascii=False)
ctx.report(1, {"loss": 0.0})
ctx.close()
"""


def hostile(sentinels: Path) -> list[str]:
    """Values that run ``touch`` under ``sentinels`` if any shell evaluates them."""
    s = sentinels
    return [
        f"$(touch {s}/dollar-paren)",
        f"`touch {s}/backtick`",
        f"x; touch {s}/semicolon",
        f"x | touch {s}/pipe",
        f"x && touch {s}/and",
        f"x\ntouch {s}/newline\n",
        f"'; touch {s}/single-quote; '",
        f'"; touch {s}/double-quote; "',
        f'$(touch {s}/in-double-quotes)"`touch {s}/bq2`"',
        'it\'s a "quoted" value',
        "*",
        "~",
        "${HOME}",
        "$HOME",
        "é…𝛂 ünïcödé",
        "-rf",
        "--help",
        "  two  spaces\tand a tab ",
        "back\\slash\\n",
        "%A_%a %j %%",
    ]


def _path_name(token: str) -> str:
    """A folder name with spaces, quotes, unicode and a relative ``touch`` of ``token``."""
    return f"d ir 'q' \"dq\" é𝛂 $(touch PWNED-{token}) `touch PWNED-{token}` ;x"


def _hostile_name(token: str) -> str:
    """An experiment name (printable, at most 128 characters) that runs ``touch`` of a
    ``PWNED-<token>`` file in the working folder if any shell evaluates it."""
    name = f"-x $(touch PWNED-{token}-n) `touch PWNED-{token}-b`; a|b && 'q' \"dq\" é𝛂"
    assert len(name) <= 128
    return name


def _sentinel_hits(sentinels: Path, token: str, roots: list[Path]) -> list[str]:
    hits = [str(p) for p in sentinels.iterdir()] if sentinels.exists() else []
    for root in roots:
        if root.is_dir():
            out = subprocess.run(
                ["find", str(root), "-xdev", "-maxdepth", "6", "-name", f"PWNED-{token}*"],
                capture_output=True,
                text=True,
                check=False,
            )
            hits += out.stdout.split()
    return hits


@pytest.fixture
def weird(tmp_path: Path) -> dict[str, Any]:
    token = uuid.uuid4().hex[:10]
    base = tmp_path / _path_name(token)
    sentinels = tmp_path / "sentinels"
    return {"token": token, "base": base, "sentinels": sentinels, "values": hostile(sentinels)}


def _experiment(weird: dict[str, Any], out: Path) -> tuple[Path, dict[str, Any]]:
    """The experiment file (as JSON, which is YAML) and what the trial must receive."""
    base: Path = weird["base"]
    values: list[str] = weird["values"]
    workdir = base / "work dir é𝛂"
    data = base / "data 'set' \"x\" é𝛂"
    ckpt = base / "ckpt dir 'c' é𝛂"
    for p in (workdir, data):
        p.mkdir(parents=True)
    (data / "f.txt").write_text("x")
    (workdir / "probe.py").write_text(PROBE)
    hparams = {f"p{i}": v for i, v in enumerate(values)}
    env = {f"V{i}": v for i, v in enumerate(values)}
    env["PROBE_OUT"] = str(out)
    env["PROBE_KEYS"] = json.dumps(sorted(f"V{i}" for i in range(len(values))))
    doc = {
        # free text: only its slug names folders and jobs; it reaches no shell
        "name": _hostile_name(weird["token"]),
        "description": "; ".join(values),
        "workdir": str(workdir),
        "entrypoint": shlex.join(["python", "probe.py", *values]),
        "resources": {"cpus_per_task": 1, "mem": "200M", "time": "00:05:00"},
        "environment": {"vars": env},
        "hyperparameters": hparams,
        "searcher": {"name": "single", "metric": "loss", "max_length": 1},
        "checkpoint": {"dir": str(ckpt)},
        "data": [str(data)],
    }
    exp = base / "exp 'x' é.yaml"
    exp.write_text(json.dumps(doc, ensure_ascii=False, indent=1), encoding="utf-8")
    expected = {
        "argv": values,
        "hparams": hparams,
        "env": {f"V{i}": v for i, v in enumerate(values)},
        "data": [str(data)],
    }
    return exp, expected


def test_hostile_values_reach_the_trial_exactly_and_run_nothing(
    slurm_env: dict[str, str], tmp_path: Path, weird: dict[str, Any]
) -> None:
    home = weird["base"] / "home é 'h' \"q\""
    cli = Cli(slurm_env, home)
    out = tmp_path / "received.json"
    exp, expected = _experiment(weird, out)

    dry = cli("launch", str(exp), "--dry-run", "--json")
    scripts = json.loads(dry.stdout)["scripts"]
    assert scripts and not home.exists()  # a dry run writes nothing
    for script in scripts:
        subprocess.run(["bash", "-n"], input=script, text=True, check=True)

    launched = cli.json("launch", str(exp))
    exp_id = launched["experiment_id"]
    try:
        done = cli.tick_until(exp_id, lambda e: e["state"] != "ACTIVE", timeout=180)
    finally:
        arrays = sorted({j.split("_")[0] for j in launched["slurm_job_ids"]})
        subprocess.run(["scancel", *arrays], env=slurm_env, capture_output=True, check=False)
    assert done["state"] == "COMPLETED", done
    got = json.loads(out.read_text(encoding="utf-8"))
    assert got["argv"] == expected["argv"]
    assert got["hparams"] == expected["hparams"]
    assert got["env"] == expected["env"]
    assert got["data"] == expected["data"]
    # the run and checkpoint folders are named by the name's slug, nothing else of it
    folder = experiment_dir_name(exp_id, name_slug(_hostile_name(weird["token"])))
    assert re.fullmatch(rf"exp-{exp_id:06d}-[a-z0-9-]+", folder), folder
    assert Path(done["run_dir"]).name == folder
    ckpt = weird["base"] / "ckpt dir 'c' é𝛂" / folder
    assert got["checkpoint_dir"] == str(ckpt / "trial-000001")
    assert "probe.py" in got["cwd_files"]  # ran in the snapshot of the odd workdir
    log = trial_dir(home / "runs", exp_id, 1, recorded_slug(exp_id, done["run_dir"]))
    assert log.is_dir() and log.parent.parent.name == folder
    roots = [tmp_path, REPO, Path.home(), Path(os.environ.get("TMPDIR", "/tmp"))]
    assert _sentinel_hits(weird["sentinels"], weird["token"], roots) == []


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("name", "new\nline"),  # other hostile names are accepted: see _hostile_name
        ("hyperparameters", {"$(touch {s}/hp-name)": 1}),
        ("hyperparameters", {"a b": 1}),
    ],
)
def test_hostile_names_are_refused_before_anything_happens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, field: str, value: Any
) -> None:
    sentinels = tmp_path / "sentinels"
    if isinstance(value, str):
        value = value.format(s=sentinels)
    else:
        value = {k.format(s=sentinels): v for k, v in value.items()}
    doc: dict[str, Any] = {
        "name": "ok",
        "entrypoint": "true",
        "searcher": {"name": "single", "metric": "loss", "max_length": 1},
    }
    doc[field] = value
    exp = tmp_path / "exp.yaml"
    exp.write_text(json.dumps(doc))
    home = tmp_path / "home"
    monkeypatch.setenv("DLHPC_HOME", str(home))
    monkeypatch.setenv("DLHPC_SITE", "local")
    res = run("launch", str(exp))
    assert res.exit_code == 2, res.output
    assert f"{exp}:" in res.output and field in res.output
    assert not home.exists() and not sentinels.exists()


def _request(folder: Path, python: str) -> JobRequest:
    return JobRequest(
        experiment_id=1,
        name="dlhpc-e1-quoting",
        folder=folder,
        trial_dirs=[folder / "t1"],
        resources=Resources(partition="debug", time_minutes=10),
        preemption=PreemptionConfig(signal="USR2", lead_time_s=60),
        site=SiteConfig(name="x", source=None, backend="slurm"),
        python=python,
        env={"V": "$(touch x)\n`y` 'z'"},
    )


def test_rendered_script_passes_paths_and_interpreter_as_single_words(
    tmp_path: Path, weird: dict[str, Any]
) -> None:
    """Run the rendered sbatch script with a fake ``srun`` that records its argv: the
    interpreter path and the folder (spaces, quotes, unicode, ``$(...)``) arrive as
    single, unchanged words, and the exported variable keeps its value."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    argv_file = tmp_path / "srun-argv.json"
    (bin_dir / "srun").write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        "got = {'argv': sys.argv[1:], 'V': os.environ.get('V')}\n"
        f"json.dump(got, open({str(argv_file)!r}, 'w'))\n"
    )
    (bin_dir / "srun").chmod(0o755)
    python = str(weird["base"] / "venv 'v' é" / "bin" / "python")
    folder = weird["base"] / "jobs 'j' \"q\" é𝛂"
    [script] = SlurmScheduler().render(_request(folder, python))
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)}
    subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, check=True, timeout=30)
    got = json.loads(argv_file.read_text())
    assert got["V"] == "$(touch x)\n`y` 'z'"
    argv = got["argv"]
    assert argv[-5:] == [python, "-u", "-m", "submitit.core._submit", str(folder)]
    assert argv[argv.index("--output") + 1].startswith(str(folder) + "/")
    for line in script.splitlines():
        if line.startswith("#SBATCH --output=") or line.startswith("#SBATCH --error="):
            assert shlex.split(line.split("=", 1)[1])[0].startswith(str(folder) + "/")
    assert _sentinel_hits(weird["sentinels"], weird["token"], [tmp_path]) == []
    assert not (tmp_path / "x").exists()
    assert shutil.which("srun", path=env["PATH"]) == str(bin_dir / "srun")
