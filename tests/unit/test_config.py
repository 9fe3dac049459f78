"""dlhpc.config: experiment files (schema v1), resolution against sites, errors."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from dlhpc.config import (
    ExperimentConfig,
    HParam,
    parse_duration_s,
    parse_slurm_time,
)
from dlhpc.config.serde import from_jsonable, to_jsonable
from dlhpc.errors import ConfigError
from tests._config import load_experiment

HEAD = "name: t\nentrypoint: python t.py\n"  # two lines: fragments start at line 3


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A controlled environment (no sbatch on PATH); the cwd is ``tmp_path``."""
    (tmp_path / "home").mkdir()
    (tmp_path / "bin").mkdir()
    monkeypatch.chdir(tmp_path)
    return {"HOME": str(tmp_path / "home"), "PATH": str(tmp_path / "bin"), "USER": "alice"}


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def errors(env: dict[str, str], text: str, name: str = "exp.yaml", **kw: str) -> list[str]:
    write(Path(name), text)
    with pytest.raises(ConfigError) as info:
        load_experiment(name, environ=env, **kw)
    assert info.value.exit_code == 2
    return str(info.value).splitlines()


def fake_sbatch(env: dict[str, str]) -> None:
    sbatch = Path(env["PATH"]) / "sbatch"
    sbatch.write_text("#!/bin/sh\n")
    sbatch.chmod(0o755)


SITE = """\
name: uni
backend: auto
partition: gpu
account: lab
qos: normal
partitions:
  gpu: {gpus_per_node: 4, gpu_type: a100, max_time: "1-00:00:00"}
  scav: {gpus_per_node: 8, max_time: UNLIMITED, preemptible: true}
  cpu: {}
scratch: /lustre/$USER
state_dir: ~/state
signal: SIGUSR1
lead_time: 5m
modules: [module load cuda/12.1]
max_array_size: 500
env: {NCCL_SOCKET_IFNAME: ib0, OMP_NUM_THREADS: 1}
journal_mode: wal
local_max_parallel: 3
"""

FULL = """\
name: mnist-sweep.v2
description: a full example
entrypoint: python train.py --epochs 3
workdir: code
site: sites/uni.yaml
resources:
  nodes: 2
  gpus_per_node: 4
  tasks_per_node: 2
  cpus_per_task: 8
  mem: 64G
  time: 01:30:00
  partition: scav
  account: other
  qos: high
  constraint: a100&ib
  sbatch_args: [--exclusive, --mail-type=END]
environment:
  setup: |
    source venv/bin/activate
  vars: {FOO: bar, N: 3, X: 0.5}
hyperparameters:
  lr: {type: log, minval: -5, maxval: -1, base: 2, count: 3}
  layers: {type: int, minval: 1, maxval: 4, count: 4}
  dropout: {type: double, minval: 0.0, maxval: 0.5, count: 2}
  opt: {type: categorical, vals: [adam, sgd, {name: lamb}]}
  batch_size: 64
  model: {depth: 3, act: relu}
  sched: {type: const, val: {type: cosine}}
searcher:
  name: grid
  metric: val_acc
  smaller_is_better: false
  max_trials: 10
  max_concurrent_trials: 4
  max_length: 20
  divisor: 4
  max_rungs: 3
  seed: 7
checkpoint: {dir: ~/ckpt, keep_best: 2, keep_latest: 3}
max_restarts: 0
preemption: {signal: TERM, lead_time: 90}
reproducibility: {deterministic: true}
deepspeed: {config: ds.json}
"""


def test_full_experiment_resolves_every_field(tmp_path: Path, env: dict[str, str]) -> None:
    write(tmp_path / "sites/uni.yaml", SITE)
    (tmp_path / "code").mkdir()
    (tmp_path / "ds.json").write_text('{"train_batch_size": "auto", "zero_optimization": {}}')
    fake_sbatch(env)
    cfg = load_experiment(write(tmp_path / "exp.yaml", FULL), environ=env)
    home = Path(env["HOME"])

    assert (cfg.name, cfg.description) == ("mnist-sweep.v2", "a full example")
    assert cfg.entrypoint == "python train.py --epochs 3"
    assert cfg.workdir == tmp_path / "code"
    assert cfg.source == tmp_path / "exp.yaml"
    assert cfg.backend == "slurm"  # auto, and sbatch is on PATH
    r = cfg.resources
    assert (r.nodes, r.gpus_per_node, r.tasks_per_node, r.cpus_per_task) == (2, 4, 2, 8)
    assert (r.mem, r.time, r.time_minutes) == ("64G", "01:30:00", 90)
    assert (r.partition, r.account, r.qos, r.constraint) == ("scav", "other", "high", "a100&ib")
    assert r.sbatch_args == ("--exclusive", "--mail-type=END")
    assert cfg.environment.setup == "source venv/bin/activate\n"
    assert cfg.environment.vars == {"FOO": "bar", "N": "3", "X": "0.5"}
    hp = cfg.hyperparameters
    assert hp["lr"] == HParam("lr", "log", minval=-5.0, maxval=-1.0, base=2.0, count=3)
    assert hp["layers"] == HParam("layers", "int", minval=1, maxval=4, count=4)
    assert hp["dropout"] == HParam("dropout", "double", minval=0.0, maxval=0.5, count=2)
    assert hp["opt"] == HParam("opt", "categorical", vals=("adam", "sgd", {"name": "lamb"}))
    assert hp["batch_size"] == HParam("batch_size", "const", value=64)
    assert hp["model"] == HParam("model", "const", value={"depth": 3, "act": "relu"})
    assert hp["sched"] == HParam("sched", "const", value={"type": "cosine"})
    s = cfg.searcher
    assert (s.name, s.metric, s.smaller_is_better) == ("grid", "val_acc", False)
    assert (s.max_trials, s.max_concurrent_trials, s.max_length) == (10, 4, 20)
    assert (s.divisor, s.max_rungs, s.seed, s.mode) == (4, 3, 7, None)
    assert cfg.checkpoint.dir == home / "ckpt"
    assert (cfg.checkpoint.keep_best, cfg.checkpoint.keep_latest) == (2, 3)
    assert cfg.max_restarts == 0
    assert (cfg.preemption.signal, cfg.preemption.lead_time_s) == ("TERM", 90)
    assert (cfg.reproducibility.seed, cfg.reproducibility.deterministic) == (7, True)
    assert cfg.deepspeed is not None and cfg.deepspeed.path == tmp_path / "ds.json"
    assert cfg.deepspeed.config == {"train_batch_size": "auto", "zero_optimization": {}}
    site = cfg.site
    assert (site.name, site.source, site.backend) == ("uni", tmp_path / "sites/uni.yaml", "auto")
    assert (site.partition, site.account, site.qos) == ("gpu", "lab", "normal")
    assert site.partitions["gpu"].max_time_minutes == 1440
    assert site.partitions["scav"].max_time_minutes is None and site.partitions["scav"].preemptible
    assert site.partitions["cpu"].gpus_per_node == 0
    assert (site.scratch, site.state_dir) == (Path("/lustre/alice"), home / "state")
    assert (site.signal, site.lead_time_s, site.modules) == (
        "USR1",
        300,
        ("module load cuda/12.1",),
    )
    assert (site.max_array_size, site.journal_mode, site.local_max_parallel) == (500, "wal", 3)
    assert site.env == {"NCCL_SOCKET_IFNAME": "ib0", "OMP_NUM_THREADS": "1"}
    assert cfg.raw["resources"]["time"] == "01:30:00" and cfg.raw["name"] == "mnist-sweep.v2"
    # What the orchestrator stores must come back identical.
    back = from_jsonable(ExperimentConfig, json.loads(json.dumps(to_jsonable(cfg))))
    assert back == cfg


def test_minimal_experiment_gets_every_default(tmp_path: Path, env: dict[str, str]) -> None:
    cfg = load_experiment(write(tmp_path / "exp.yaml", HEAD), environ=env)
    home = Path(env["HOME"])
    assert cfg.site.name == "local" and cfg.backend == "local"  # auto: no sbatch on PATH
    assert cfg.workdir == tmp_path and cfg.description == ""
    r = cfg.resources
    assert (r.nodes, r.gpus_per_node, r.tasks_per_node, r.cpus_per_task, r.mem) == (
        1, 0, 1, 1, "4G"
    )  # fmt: skip
    assert (r.time, r.time_minutes, r.partition, r.account, r.qos, r.constraint) == (
        "01:00:00", 60, None, None, None, None
    )  # fmt: skip
    assert r.sbatch_args == () and cfg.environment.setup == "" and cfg.environment.vars == {}
    assert cfg.hyperparameters == {}
    s = cfg.searcher
    assert (s.name, s.metric, s.smaller_is_better, s.max_trials) == ("single", "val_loss", True, 1)
    assert (s.max_concurrent_trials, s.max_length, s.divisor, s.max_rungs) == (0, 1, 3, 5)
    assert (s.seed, s.mode) == (0, None)
    assert cfg.checkpoint.dir == home / ".dlhpc/scratch/checkpoints"
    assert (cfg.checkpoint.keep_best, cfg.checkpoint.keep_latest, cfg.max_restarts) == (1, 1, 5)
    assert (cfg.preemption.signal, cfg.preemption.lead_time_s) == ("USR2", 120)
    assert (cfg.reproducibility.seed, cfg.reproducibility.deterministic) == (0, False)
    assert cfg.deepspeed is None
    assert cfg.raw == {"name": "t", "entrypoint": "python t.py"}
    assert not (home / ".dlhpc").exists()  # loading creates nothing


def test_small_defaults_that_depend_on_other_fields(tmp_path: Path, env: dict[str, str]) -> None:
    text = (
        HEAD
        + "resources: {gpus_per_node: 3}\nsearcher: {name: hyperband, seed: 9, max_length: 8}\n"
    )
    cfg = load_experiment(write(tmp_path / "exp.yaml", text), environ=env)
    assert cfg.resources.tasks_per_node == 3
    assert cfg.searcher.mode == "standard" and cfg.reproducibility.seed == 9


@pytest.mark.parametrize("mem", ["953674T", "512K", "0", "999999999999"])
def test_mem_up_to_the_bound_loads(tmp_path: Path, env: dict[str, str], mem: str) -> None:
    """The string and integer forms share one bound, 10^12 MB (953,674T is under it)."""
    text = HEAD + f"resources: {{mem: {mem}}}\n"
    assert load_experiment(write(tmp_path / "exp.yaml", text), environ=env).resources.mem == mem


def test_site_defaults_apply_and_experiment_overrides(tmp_path: Path, env: dict[str, str]) -> None:
    write(tmp_path / "uni.yaml", SITE)
    cfg = load_experiment(write(tmp_path / "a.yaml", HEAD), site="./uni.yaml", environ=env)
    r, p = cfg.resources, cfg.preemption
    assert (r.partition, r.account, r.qos, p.signal, p.lead_time_s) == (
        "gpu", "lab", "normal", "USR1", 300
    )  # fmt: skip
    assert cfg.checkpoint.dir == Path("/lustre/alice/checkpoints")
    assert cfg.backend == "local"  # auto, no sbatch
    text = HEAD + (
        "resources: {partition: cpu, account: a2, qos: q2}\n"
        "preemption: {signal: sigint, lead_time: 2m}\n"
    )
    cfg = load_experiment(write(tmp_path / "b.yaml", text), site="uni.yaml", environ=env)
    r, p = cfg.resources, cfg.preemption
    assert (r.partition, r.account, r.qos, p.signal, p.lead_time_s) == (
        "cpu",
        "a2",
        "q2",
        "INT",
        120,
    )


def test_site_precedence_argument_key_env_auto(tmp_path: Path, env: dict[str, str]) -> None:
    for name in ("arg", "key", "envsite"):
        write(tmp_path / f"sites/{name}.yaml", f"name: {name}\n")
    env["DLHPC_SITE_PATH"] = str(tmp_path / "sites")
    keyed = write(tmp_path / "k.yaml", HEAD + "site: key\n")
    plain = write(tmp_path / "p.yaml", HEAD)
    assert load_experiment(keyed, site="arg", environ=env).site.name == "arg"
    assert load_experiment(keyed, environ={**env, "DLHPC_SITE": "envsite"}).site.name == "key"
    assert load_experiment(plain, environ={**env, "DLHPC_SITE": "envsite"}).site.name == "envsite"
    assert load_experiment(plain, environ=env).site.name == "local"
    fake_sbatch(env)
    cfg = load_experiment(plain, environ=env)
    assert (cfg.site.name, cfg.backend) == ("generic", "slurm")


def test_dlhpc_home_wins_and_scratch_follows_state_dir(tmp_path: Path, env: dict[str, str]) -> None:
    write(tmp_path / "s.yaml", "state_dir: /somewhere\n")
    env["DLHPC_HOME"] = "~/h"
    cfg = load_experiment(write(tmp_path / "e.yaml", HEAD + "site: s.yaml\n"), environ=env)
    assert cfg.site.state_dir == Path(env["HOME"]) / "h"
    assert cfg.site.scratch == Path(env["HOME"]) / "h/scratch"
    assert cfg.site.name == "s"  # the file stem when the file has no name


def test_site_search_path_order(tmp_path: Path, env: dict[str, str]) -> None:
    from dlhpc.config import list_sites, site_search_path
    from tests._config import load_site

    user = Path(env["HOME"]) / ".config/dlhpc/sites"
    write(user / "dev-cluster.yaml", "name: mine\nbackend: local\n")
    write(tmp_path / "p1/x.yaml", "name: first\n")
    write(tmp_path / "p2/x.yaml", "name: second\n")
    env["DLHPC_SITE_PATH"] = "p1::p2"
    path = site_search_path(env)
    assert path[:3] == [tmp_path / "p1", tmp_path / "p2", user]
    assert path[3].name == "site-configs"
    assert load_site("x", env).name == "first"
    assert load_site("dev-cluster", env).name == "mine"  # the user's shadows the shipped one
    assert {"generic", "local", "x"} <= set(list_sites(env))
    assert load_site(None, {**env, "DLHPC_SITE": "x"}).name == "first"


def test_unknown_site_lists_available_names(env: dict[str, str]) -> None:
    (line,) = errors(env, HEAD + "site: dev-clustr\n")
    assert line.startswith(
        "exp.yaml:3: site: unknown site 'dev-clustr'; did you mean 'dev-cluster'? (available: "
    )
    assert "generic" in line and "local" in line
    from tests._config import load_site

    with pytest.raises(ConfigError, match=r"^site: unknown site 'nope'; \(available: "):
        load_site("nope", env)
    with pytest.raises(ConfigError, match=r"^missing.yaml: file not found$"):
        load_site("missing.yaml", env)


def test_partition_checks_against_the_site(tmp_path: Path, env: dict[str, str]) -> None:
    write(tmp_path / "uni.yaml", SITE)
    text = HEAD + "resources:\n  partition: gpuu\n"
    assert errors(env, text, site="uni.yaml") == [
        "exp.yaml:4: resources.partition: partition 'gpuu' is not listed by site 'uni'; "
        "did you mean 'gpu'? (valid: cpu, gpu, scav)"
    ]
    text = HEAD + 'resources:\n  gpus_per_node: 5\n  time: "1-00:00:01"\n'
    assert errors(env, text, site="uni.yaml") == [
        "exp.yaml:4: resources.gpus_per_node: partition 'gpu' has 4 GPU(s) per node, got 5",
        "exp.yaml:5: resources.time: exceeds partition 'gpu''s max_time 1-00:00:00, "
        "got '1-00:00:01' (1-00:01:00)",
    ]
    # No partition anywhere: Slurm picks its default, nothing to check.
    write(tmp_path / "nodefault.yaml", "partitions: {a: {}}\n")
    cfg = load_experiment(write(tmp_path / "e.yaml", HEAD), site="nodefault.yaml", environ=env)
    assert cfg.resources.partition is None


def test_site_file_errors_name_the_site_file(tmp_path: Path, env: dict[str, str]) -> None:
    write(
        tmp_path / "bad.yaml",
        """\
        backend: slurmm
        partition: nope
        partitions:
          a: {gpus_per_node: -1, max_time: soon}
          b c: {}
        journal_mode: WAL
        max_array_size: 0
        scratch: $UNDEFINED/x
        preemptible: true
        """,
    )
    assert errors(env, HEAD + "max_restarts: -1\n", site="bad.yaml") == [
        "exp.yaml:3: max_restarts: must be an integer >= 0, got -1",
        "bad.yaml:1: backend: must be one of auto, slurm, local, got 'slurmm'",
        "bad.yaml:4: partitions.a.gpus_per_node: must be an integer between 0 and 1024, got -1",
        "bad.yaml:4: partitions.a.max_time: must be a Slurm time (MM, MM:SS, HH:MM:SS, D-HH, "
        "D-HH:MM or D-HH:MM:SS), got 'soon'",
        "bad.yaml:5: partitions.b c: not a valid partition name: 'b c'",
        "bad.yaml:6: journal_mode: must be one of delete, wal, got 'WAL'",
        "bad.yaml:7: max_array_size: must be an integer between 1 and 10000000, got 0",
        "bad.yaml:8: scratch: undefined environment variable $UNDEFINED",
        "bad.yaml:9: preemptible: unknown key; (valid: account, backend, env, gpu_request, "
        "journal_mode, "
        "lead_time, local_max_parallel, max_array_size, modules, name, partition, partitions, "
        "permissions, python, "
        "qos, scratch, signal, state_dir)",
    ]
    write(tmp_path / "bad2.yaml", "partition: gpuu\npartitions: {gpu: {}}\n")
    assert errors(env, HEAD, site="bad2.yaml") == [
        "bad2.yaml:1: partition: partition 'gpuu' is not listed by site 'bad2'; "
        "did you mean 'gpu'? (valid: gpu)"
    ]


ERROR_CASES = [
    ("searcher:\n  divisor: 1\n", "4: searcher.divisor: must be an integer >= 2, got 1"),
    ("searcher:\n  max_trials: '5'\n", "4: searcher.max_trials: must be an integer >= 1, got '5'"),
    (
        "searcher:\n  max_trials: true\n",
        "4: searcher.max_trials: must be an integer >= 1, got true",
    ),
    ("searcher:\n  max_trials: 2.0\n", "4: searcher.max_trials: must be an integer >= 1, got 2.0"),
    (
        "searcher: {smaller_is_better: 'yes'}\n",
        "3: searcher.smaller_is_better: must be a boolean (true or false), got 'yes'",
    ),
    ("searcher: {name: asha}\n", "3: searcher.max_length: required for searcher 'asha'"),
    (
        "searcher: {name: random, mode: standard}\n",
        "3: searcher.mode: only applies to searcher 'hyperband', not 'random'",
    ),
    (
        "searcher: {name: bohb}\n",
        "3: searcher.name: must be one of single, grid, random, "
        "bayes, sha, asha, hyperband, got 'bohb'",
    ),
    (
        "searcher: {seed: -1}\n",
        "3: searcher.seed: must be an integer between 0 and 4294967295, got -1",
    ),
    (
        "searcher: {seed: 123456789012345678901234567890}\n",
        "3: searcher.seed: must be an integer between 0 and 4294967295, got a huge integer",
    ),
    (
        "searcher: {max_concurrent_trials: -1}\n",
        "3: searcher.max_concurrent_trials: must be an integer >= 0, got -1",
    ),
    ("searcher: [grid]\n", "3: searcher: must be a mapping of 'key: value' settings, got a list"),
    (
        "hyperparameters:\n  lr: {type: double, minval: 1, maxval: .nan}\n",
        "4: hyperparameters.lr.maxval: must be a finite number, got nan",
    ),
    (
        "hyperparameters:\n  lr: {type: double, minval: 2, maxval: 1}\n",
        "4: hyperparameters.lr.minval: must be <= maxval (1.0), got 2.0",
    ),
    (
        "hyperparameters:\n  n: {type: int, minval: 0.5, maxval: 3}\n",
        "4: hyperparameters.n.minval: must be an integer between -9007199254740992 and "
        "9007199254740992, got 0.5",
    ),
    (
        "hyperparameters:\n  n: {type: int, maxval: 3}\n",
        "4: hyperparameters.n.minval: required field missing",
    ),
    (
        "hyperparameters:\n  lr: {type: log, minval: 1, maxval: 2, base: 1}\n",
        "4: hyperparameters.lr.base: must be a number > 1, got 1",
    ),
    (
        "hyperparameters:\n  lr: {type: log, minval: 1, maxval: 2000}\n",
        "4: hyperparameters.lr.maxval: base ** maxval overflows a float, got 2000.0",
    ),
    (
        "hyperparameters:\n  c: {type: categorical, vals: []}\n",
        "4: hyperparameters.c.vals: must be a non-empty list of values, got a list",
    ),
    (
        "hyperparameters:\n  c: {type: categorical, vals: [a], minval: 1}\n",
        "4: hyperparameters.c.minval: unknown key; (valid: type, vals)",
    ),
    (
        "hyperparameters:\n  c: {type: categorical, vals: [1, .inf]}\n",
        "4: hyperparameters.c.vals: must not contain NaN or infinity (JSON cannot hold it), "
        "got inf",
    ),
    (
        "hyperparameters:\n  1lr: 0.1\n",
        "4: hyperparameters.1lr: not a valid hyperparameter "
        "name (letters, digits, _ . -; starting with a letter or _)",
    ),
    (
        "hyperparameters:\n  lr: {type: double, minval: 0, maxval: 1}\nsearcher: {name: grid}\n",
        "4: hyperparameters.lr: searcher 'grid' needs 'count' (the number of grid points) here",
    ),
    (
        "hyperparameters:\n  lr: {type: double, minval: 0, maxval: 1, count: 0}\n",
        "4: hyperparameters.lr.count: must be an integer between 1 and 100000, got 0",
    ),
    (
        "resources:\n  mem: 4GB\n",
        "4: resources.mem: must be megabytes (an integer) or like "
        "'4G' (digits + K/M/G/T), got '4GB'",
    ),
    (
        "resources:\n  mem: 953675T\n",
        "4: resources.mem: must be under 10^12 megabytes, got '953675T'",
    ),
    (
        "resources:\n  time: 1h\n",
        "4: resources.time: must be a Slurm time (MM, MM:SS, "
        "HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS), got '1h'",
    ),
    (
        "resources:\n  time: UNLIMITED\n",
        "4: resources.time: must be a finite Slurm time (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or "
        "D-HH:MM:SS), got 'UNLIMITED'",
    ),
    ("resources:\n  time: 0\n", "4: resources.time: must be at least one minute, got 0"),
    (
        "resources:\n  time: 2\n",
        "4: resources.time: must be longer than the site's preemption lead_time (120s), got 120s",
    ),
    ("resources:\n  nodes: 0\n", "4: resources.nodes: must be an integer >= 1, got 0"),
    (
        "resources:\n  partition: a b\n",
        "4: resources.partition: must be a single word (no spaces), got 'a b'",
    ),
    (
        "resources:\n  account: 1234\n",
        "4: resources.account: must be a single word (no spaces), got 1234 (put it in quotes)",
    ),
    (
        "resources:\n  sbatch_args: ['-p gpu']\n",
        "4: resources.sbatch_args[0]: must be one "
        "sbatch option token like '--key=value' or '--flag' (write '--partition=gpu', not "
        "'-p gpu'), got '-p gpu'",
    ),
    (
        "resources:\n  sbatch_args: --exclusive\n",
        "4: resources.sbatch_args: must be a list, got '--exclusive'",
    ),
    (
        "environment:\n  vars: {PATH-X: 1}\n",
        "4: environment.vars.PATH-X: not a valid environment variable name: 'PATH-X'",
    ),
    (
        "environment:\n  vars: {FLAG: on}\n",
        "4: environment.vars.FLAG: must be a string or a number, got true (quote it)",
    ),
    ("environment:\n  setup: [a, b]\n", "4: environment.setup: must be a string, got a list"),
    ("checkpoint: {keep_latest: 0}\n", "3: checkpoint.keep_latest: must be an integer >= 1, got 0"),
    (
        "checkpoint: {keep_experiment_best: -1}\n",
        "3: checkpoint.keep_experiment_best: must be an integer >= 0, got -1",
    ),
    ("checkpoint: {dir: 5}\n", "3: checkpoint.dir: must be a path (a string), got 5"),
    (
        "preemption:\n  signal: KILL\n",
        "4: preemption.signal: must be one of USR1, USR2, TERM, "
        "INT (SIG prefix allowed), got 'KILL'",
    ),
    (
        "preemption:\n  lead_time: 1h\n",
        "4: preemption.lead_time: must be shorter than resources.time (3600s), got 3600s",
    ),
    (
        "preemption:\n  lead_time: soon\n",
        "4: preemption.lead_time: must be a duration like "
        "'120s', '2m', '1h' or a number of seconds, got 'soon'",
    ),
    (
        "reproducibility: {deterministic: 1}\n",
        "3: reproducibility.deterministic: must be a boolean (true or false), got 1",
    ),
    (
        "deepspeed: {config: 3}\n",
        "3: deepspeed.config: must be a mapping or a path to a "
        "JSON/YAML file: must be a path (a string), got 3",
    ),
    ("deepspeed: {}\n", "3: deepspeed.config: required field missing"),
    ("workdir: nowhere\n", "3: workdir: must be an existing directory, got {tmp}/nowhere"),
    ("max_restarts: 1e3\n", "3: max_restarts: must be an integer >= 0, got '1e3'"),
    (
        "resourcse: {}\n",
        "3: resourcse: unknown key; did you mean 'resources'? (valid: "
        "checkpoint, data, deepspeed, description, entrypoint, environment, hyperparameters, "
        "max_restarts, name, preemption, reproducibility, resources, script, searcher, site, "
        "workdir)",
    ),
]


@pytest.mark.parametrize(("fragment", "expected"), ERROR_CASES)
def test_each_error_with_line_and_field(
    tmp_path: Path, env: dict[str, str], fragment: str, expected: str
) -> None:
    assert errors(env, HEAD + fragment) == ["exp.yaml:" + expected.format(tmp=tmp_path)]


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("--array=1-4", "--array is set by dlhpc itself; remove it"),
        ("--arr=1-4", "--arr (short for --array) is set by dlhpc itself; remove it"),
        ("-a1-4", "-a (--array) is set by dlhpc itself; remove it"),
        ("--output=x", "--output is set by dlhpc itself; remove it"),
        ("-o", "-o (--output) is set by dlhpc itself; remove it"),
        ("--error=x", "--error is set by dlhpc itself; remove it"),
        ("-e", "-e (--error) is set by dlhpc itself; remove it"),
        ("--signal=B:USR1@60", "--signal is set by dlhpc itself; remove it"),
        ("--job-name=x", "--job-name is set by dlhpc itself; remove it"),
        ("-Jx", "-J (--job-name) is set by dlhpc itself; remove it"),
        ("--open-mode=append", "--open-mode is set by dlhpc itself; remove it"),
        ("--requeue", "--requeue is set by dlhpc itself; remove it"),
        ("--no-requeue", "--no-requeue is set by dlhpc itself; remove it"),
    ],
)
def test_sbatch_options_dlhpc_owns_are_refused(
    env: dict[str, str], option: str, message: str
) -> None:
    text = HEAD + f"resources:\n  sbatch_args: [--exclusive, '{option}']\n"
    assert errors(env, text) == [f"exp.yaml:4: resources.sbatch_args[1]: {message}"]


def test_required_fields_and_name_rules(env: dict[str, str]) -> None:
    assert errors(env, "description: x\n") == [
        "exp.yaml: name: required field missing",
        "exp.yaml: entrypoint: required field missing",
    ]
    # Names are free-form printable text up to 128 characters.
    assert errors(env, "name: '  '\nentrypoint: a\n") == ["exp.yaml:1: name: must not be empty"]
    assert errors(env, f"name: {'a' * 129}\nentrypoint: a\n") == [
        "exp.yaml:1: name: must be at most 128 characters, got 129"
    ]
    assert errors(env, 'name: "a\\x1b[31mb"\nentrypoint: a\n') == [
        "exp.yaml:1: name: must be printable text (no control characters), got '\\x1b' "
        "(U+001B) in 'a\\x1b[31mb'"
    ]
    assert errors(env, "name: 12\nentrypoint: a\n") == [
        "exp.yaml:1: name: must be text (put it in quotes), got 12"
    ]
    assert errors(env, "name: x\nentrypoint: '  '\n") == [
        "exp.yaml:2: entrypoint: must be a non-empty string, got '  '"
    ]
    assert errors(env, 'name: x\nentrypoint: "a\\0b"\n') == [
        "exp.yaml:2: entrypoint: must not contain a NUL character"
    ]


def test_all_errors_at_once_in_file_order(env: dict[str, str]) -> None:
    text = """\
    name: ok
    entrypoint: python t.py
    searcher:
      divisor: 1
      max_trials: 0
    resources:
      gpu_per_node: 2
      nodes: two
    max_restarts: -3
    bogus: 1
    """
    assert errors(env, text) == [
        "exp.yaml:4: searcher.divisor: must be an integer >= 2, got 1",
        "exp.yaml:5: searcher.max_trials: must be an integer >= 1, got 0",
        "exp.yaml:7: resources.gpu_per_node: unknown key; did you mean 'gpus_per_node'? "
        "(valid: account, constraint, cpus_per_task, gpus_per_node, mem, nodes, partition, "
        "qos, sbatch_args, tasks_per_node, time)",
        "exp.yaml:8: resources.nodes: must be an integer >= 1, got 'two'",
        "exp.yaml:9: max_restarts: must be an integer >= 0, got -3",
        "exp.yaml:10: bogus: unknown key; (valid: checkpoint, data, deepspeed, description, "
        "entrypoint, environment, hyperparameters, max_restarts, name, preemption, "
        "reproducibility, resources, script, searcher, site, workdir)",
    ]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"", "exp.yaml: file is empty (expected a mapping of settings)"),
        (b"# only a comment\n", "exp.yaml: file is empty (expected a mapping of settings)"),
        (
            b"- a\n- b\n",
            "exp.yaml:1: top level must be a mapping of 'key: value' settings, got a list",
        ),
        (
            b"just text\n",
            "exp.yaml:1: top level must be a mapping of 'key: value' settings, got a single value",
        ),
        (
            b"name: a\nentrypoint: [b\n",
            "exp.yaml:3: invalid YAML: while parsing a flow "
            "sequence, expected ',' or ']', but got '<stream end>'",
        ),
        (
            b"name: a\n  bad: indent\n",
            "exp.yaml:2: invalid YAML: mapping values are not allowed here",
        ),
        (
            b"name: a\nentrypoint: b\nname: c\n",
            "exp.yaml:3: duplicate key 'name' (first at line 1)",
        ),
        (
            b"name: a\n---\nname: b\n",
            "exp.yaml:2: invalid YAML: expected a single document in "
            "the stream, but found another document",
        ),
        (b"name: a\nx: \xff\xfe\n", "exp.yaml:2: not UTF-8 text (byte 0xff); is it a binary file?"),
        (b"\x7fELF\x00\x01", "exp.yaml:1: invalid YAML: unprintable character '\\x7f'"),
        (b"a: &a [*a]\n", "exp.yaml:1: recursive alias (a value that contains itself)"),
        (b"a: !!binary aGVsbG8=\n", "exp.yaml:1: unsupported YAML tag tag:yaml.org,2002:binary"),
        (b"a: !custom x\n", "exp.yaml:1: unsupported YAML tag !custom"),
        (b"a: !!set {x}\n", "exp.yaml:1: unsupported YAML tag tag:yaml.org,2002:set"),
        (b"a: !!int x\n", "exp.yaml:1: invalid int value 'x'"),
        (b"? [a]\n: b\n", "exp.yaml:1: mapping keys must be plain text, not a list or mapping"),
        (b"a: " + b"[" * 80 + b"]" * 80 + b"\n", "exp.yaml:1: nested deeper than 64 levels"),
    ],
)
def test_unreadable_documents(env: dict[str, str], content: bytes, expected: str) -> None:
    Path("exp.yaml").write_bytes(content)
    with pytest.raises(ConfigError) as info:
        load_experiment("exp.yaml", environ=env)
    assert str(info.value) == expected


def test_alias_bomb_and_huge_values_are_refused(tmp_path: Path, env: dict[str, str]) -> None:
    bomb = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    bomb += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    Path("exp.yaml").write_text("\n".join(bomb) + "\n")
    with pytest.raises(ConfigError, match="document too large"):
        load_experiment("exp.yaml", environ=env)
    Path("exp.yaml").write_text(HEAD + "max_restarts: " + "9" * 5000 + "\n")
    with pytest.raises(ConfigError, match=r"^exp.yaml:3: invalid int value '9999"):
        load_experiment("exp.yaml", environ=env)
    Path("exp.yaml").write_text("a: " + "[" * 5000 + "\n")
    with pytest.raises(ConfigError, match="^exp.yaml:1: nested deeper than 64 levels$"):
        load_experiment("exp.yaml", environ=env)
    Path("exp.yaml").write_text("a:\n" + "".join(" " * i + "- \n" for i in range(200)))
    with pytest.raises(ConfigError, match="^exp.yaml:65: nested deeper than 64 levels$"):
        load_experiment("exp.yaml", environ=env)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 900 + "]" * 900)
    assert errors(env, HEAD + "deepspeed: {config: deep.json}\n")[1] == (
        f"{deep}:1: top level must be a mapping, got a list"
    )
    deep.write_text('{"a": ' + "[" * 900 + "]" * 900 + "}")
    load_experiment(
        write(tmp_path / "d.yaml", HEAD + "deepspeed: {config: deep.json}\n"), environ=env
    )
    deep.write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert errors(env, HEAD + "deepspeed: {config: deep.json}\n")[1] == (
        f"{deep}: invalid JSON: nested too deeply"
    )


def test_missing_unreadable_and_directory_paths(tmp_path: Path, env: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="^nope.yaml: file not found$"):
        load_experiment("nope.yaml", environ=env)
    with pytest.raises(ConfigError, match="^home: is a directory, not a YAML file$"):
        load_experiment("home", environ=env)


def test_yaml_conveniences(tmp_path: Path, env: dict[str, str]) -> None:
    # Anchors + merge keys; unquoted 01:30:00 and dates stay text, not numbers.
    text = HEAD + (
        "description: 2024-01-02\n"
        "hyperparameters: {h: 1:30}\n"
        "resources:\n  <<: {gpus_per_node: 2, time: 30, nodes: 3}\n  nodes: 2\n"
    )
    cfg = load_experiment(write(tmp_path / "exp.yaml", text), environ=env)
    assert cfg.description == "2024-01-02"
    assert cfg.hyperparameters["h"].value == "1:30"
    r = cfg.resources
    assert (r.gpus_per_node, r.time, r.time_minutes, r.nodes) == (2, "30", 30, 2)
    cfg = load_experiment(
        write(tmp_path / "e2.yaml", HEAD + "resources: {time: 1:30:00}\n"), environ=env
    )
    assert (cfg.resources.time, cfg.resources.time_minutes) == ("1:30:00", 90)


def test_path_expansion(tmp_path: Path, env: dict[str, str]) -> None:
    env.update(SCRATCH="/scratch/alice", EMPTY="")
    home = Path(env["HOME"])
    (tmp_path / "sub/code").mkdir(parents=True)
    cases = {
        "~/c": home / "c",
        "$SCRATCH/c": Path("/scratch/alice/c"),
        "${SCRATCH}/c/../d": Path("/scratch/alice/d"),
        "${NOPE:-/tmp/x}/c": Path("/tmp/x/c"),
        "${EMPTY:-/e}/c": Path("/e/c"),
        "rel/c": tmp_path / "sub/rel/c",  # relative to the YAML's folder
        "/abs/$5": Path("/abs/$5"),
    }
    for given, expected in cases.items():
        text = HEAD + f"checkpoint: {{dir: '{given}'}}\nworkdir: code\n"
        cfg = load_experiment(write(tmp_path / "sub/exp.yaml", text), environ=env)
        assert cfg.checkpoint.dir == expected, given
        assert cfg.workdir == tmp_path / "sub/code"
    assert errors(env, HEAD + "checkpoint: {dir: $SCRATCH/$NOPE}\nworkdir: ${ALSO_NOPE}\n") == [
        "exp.yaml:3: checkpoint.dir: undefined environment variable $NOPE",
        "exp.yaml:4: workdir: undefined environment variable $ALSO_NOPE",
    ]
    assert errors(env, HEAD + "checkpoint: {dir: '${X'}\n") == [
        "exp.yaml:3: checkpoint.dir: unterminated '${' in '${X'"
    ]
    assert errors(env, HEAD + "checkpoint: {dir: ~nosuchuser_dlhpc/x}\n") == [
        "exp.yaml:3: checkpoint.dir: unknown user in '~nosuchuser_dlhpc'"
    ]


def test_deepspeed_config_sources(tmp_path: Path, env: dict[str, str]) -> None:
    write(tmp_path / "ds.yaml", "zero_optimization: {stage: 2}\n")
    cfg = load_experiment(
        write(tmp_path / "a.yaml", HEAD + "deepspeed: {config: ds.yaml}\n"), environ=env
    )
    assert cfg.deepspeed is not None and cfg.deepspeed.config == {"zero_optimization": {"stage": 2}}
    inline = HEAD + "deepspeed:\n  config: {fp16: {enabled: true}}\n"
    cfg = load_experiment(write(tmp_path / "b.yaml", inline), environ=env)
    assert cfg.deepspeed == type(cfg.deepspeed)(config={"fp16": {"enabled": True}}, path=None)
    (tmp_path / "bad.json").write_text('{\n  "a": 1,\n  "a": 2\n}')
    broken = '{\n  "a": 1,\n}'
    (tmp_path / "broken.json").write_text(broken)
    (tmp_path / "list.json").write_text("[1]")
    ds = tmp_path
    assert errors(env, HEAD + "deepspeed: {config: bad.json}\n") == [
        f"exp.yaml:3: deepspeed.config: cannot use {ds}/bad.json (see below)",
        f"{ds}/bad.json: invalid JSON: duplicate key 'a'",
    ]
    with pytest.raises(json.JSONDecodeError) as why:  # its line and words differ by Python
        json.loads(broken)
    assert errors(env, HEAD + "deepspeed: {config: broken.json}\n")[1] == (
        f"{ds}/broken.json:{why.value.lineno}: invalid JSON: {why.value.msg}"
    )
    assert errors(env, HEAD + "deepspeed: {config: list.json}\n")[1] == (
        f"{ds}/list.json:1: top level must be a mapping, got a list"
    )
    assert errors(env, HEAD + "deepspeed: {config: none.json}\n")[1] == (
        f"{ds}/none.json: file not found"
    )


def test_hyperparameter_const_forms(tmp_path: Path, env: dict[str, str]) -> None:
    text = HEAD + (
        "hyperparameters:\n  a: null\n  b: [1, 2]\n  c: {x: {type: 1}}\n"
        "  d: {type: const, val: [1]}\n"
    )
    hp = load_experiment(write(tmp_path / "e.yaml", text), environ=env).hyperparameters
    assert [(h.type, h.value) for h in hp.values()] == [
        ("const", None), ("const", [1, 2]), ("const", {"x": {"type": 1}}), ("const", [1])
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "minutes"),
    [
        ("90", 90), ("0", 0), ("5:30", 6), ("05:00", 5), ("48:00:00", 2880), ("01:30:00", 90),
        ("1-0", 1440), ("2-12", 3600), ("1-01:30", 1530), ("1-00:00:01", 1441), (" 30 ", 30),
    ],
)  # fmt: skip
def test_parse_slurm_time(text: str, minutes: int) -> None:
    assert parse_slurm_time(text) == minutes


@pytest.mark.parametrize(
    "text", ["", "1h", "-5", "1:60", "1:2:3:4", "1-24", "1-1:60", "1-", "a-1", "١٢", "1:00:60"]
)
def test_parse_slurm_time_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="must be a Slurm time"):
        parse_slurm_time(text)


def test_parse_slurm_time_unlimited_and_ints() -> None:
    assert parse_slurm_time("UNLIMITED", allow_unlimited=True) is None
    assert parse_slurm_time("infinite", allow_unlimited=True) is None
    assert parse_slurm_time(15) == 15
    with pytest.raises(ValueError, match="finite"):
        parse_slurm_time("UNLIMITED")
    for bad in (True, -1, 1.5, None):
        with pytest.raises(ValueError):
            parse_slurm_time(bad)  # type: ignore[arg-type]


def test_parse_duration_s() -> None:
    assert [parse_duration_s(v) for v in ("120s", "2m", "1h", "90", 45, " 7s ")] == [
        120, 120, 3600, 90, 45, 7
    ]  # fmt: skip
    for bad in ("2 m", "1d", "-1", "", "1.5m", True, None, 2.0):
        with pytest.raises(ValueError, match="must be a duration"):
            parse_duration_s(bad)  # type: ignore[arg-type]


def test_site_key_path_is_relative_to_the_yaml_folder(tmp_path: Path, env: dict[str, str]) -> None:
    write(tmp_path / "proj/sites/lab.yaml", "name: lab\n")
    exp = write(tmp_path / "proj/exp/e.yaml", HEAD + "site: ../sites/lab.yaml\n")
    assert load_experiment(exp, environ=env).site.name == "lab"
    # An unknown site is reported in line order with the file's other problems.
    text = HEAD + "site: nowhere\nmax_restarts: -1\n"
    lines = errors(env, "searcher: {divisor: 0}\n" + text)
    assert [line.split(":")[1] for line in lines] == ["1", "4", "5"]
    assert lines[1].startswith("exp.yaml:4: site: unknown site 'nowhere'; (available: ")


def test_adaptive_searcher_fields(tmp_path: Path, env: dict[str, str]) -> None:
    def searcher(text: str) -> object:
        write(Path("ok.yaml"), HEAD + text)
        return load_experiment("ok.yaml", environ=env).searcher

    s = searcher("searcher: {name: asha, max_length: 27, min_length: 3, metric: m}\n")
    assert (s.max_rungs, s.min_length, s.max_concurrent_trials) == (3, 3, 16)  # type: ignore[attr-defined]
    s = searcher(
        "searcher: {name: asha, max_length: 9, stop_once: true, max_concurrent_trials: 0}\n"
    )
    assert s.stop_once and s.max_concurrent_trials == 0 and s.max_rungs == 5  # type: ignore[attr-defined]
    assert searcher("searcher: {name: random}\n").max_concurrent_trials == 0  # type: ignore[attr-defined]
    assert searcher("searcher: {name: bayes, max_length: 2}\n").max_concurrent_trials == 16  # type: ignore[attr-defined]
    out = errors(
        env,
        HEAD + "searcher:\n  name: hyperband\n  max_length: 9\n  max_rungs: 2\n  min_length: 10\n"
        "  stop_once: true\n",
    )
    assert any("exp.yaml:7: searcher.min_length" in ln and "not both" in ln for ln in out), out
    assert any("searcher.min_length" in ln and "<= max_length (9)" in ln for ln in out), out
    assert any("exp.yaml:8: searcher.stop_once" in ln for ln in out), out
    out = errors(env, HEAD + "searcher: {name: random, min_length: 2}\n")
    assert any("searcher.min_length" in ln and "only applies" in ln for ln in out), out
