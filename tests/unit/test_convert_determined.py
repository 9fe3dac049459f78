"""``dlhpc convert determined``: each hyperparameter type and searcher, the fields it
cannot translate listed (stderr and the output's head), bad input exits 2 with
file:line and field, and the output loads with dlhpc's own loader."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result

from dlhpc.cli.main import cli
from dlhpc.config import load_experiment
from dlhpc.convert import convert_determined
from dlhpc.convert._trial_api import TRIAL_MODULES
from dlhpc.search import SearcherTable

EXAMPLE = Path(__file__).resolve().parents[2] / "templates" / "examples" / "determined-core"


@pytest.fixture(autouse=True)
def _local_site(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DLHPC_SITE", "local")


def _convert(tmp_path: Path, text: str, *args: str) -> tuple[Result, Path]:
    src = tmp_path / "det.yaml"
    src.write_text(textwrap.dedent(text))
    out = tmp_path / "out" / "exp.yaml"
    res = CliRunner().invoke(
        cli, ["convert", "determined", str(src), "-o", str(out), *args], catch_exceptions=False
    )
    return res, out


def _ok(tmp_path: Path, text: str, *args: str) -> dict[str, Any]:
    res, out = _convert(tmp_path, text, *args)
    assert res.exit_code == 0, res.output
    # loads with dlhpc's loader (the command checked it too)
    load_experiment(out, searchers=SearcherTable())
    data = yaml.safe_load(out.read_text())
    assert isinstance(data, dict)
    return data


BASE = """\
name: t
entrypoint: python3 train.py
searcher: {name: single, metric: val_loss, max_length: {batches: 10}}
"""


def test_every_hyperparameter_type(tmp_path: Path) -> None:
    data = _ok(
        tmp_path,
        BASE
        + """\
hyperparameters:
  bare: 0.5
  c: {type: const, val: [1, 2]}
  i: {type: int, minval: 1, maxval: 8, count: 3}
  d: {type: double, minval: 0.0, maxval: 0.5}
  lg: {type: log, minval: -4, maxval: -1, base: 2}
  cat: {type: categorical, vals: [adam, sgd]}
  optimizer:
    lr: {type: log, minval: -3, maxval: -1, base: 10}
    momentum: 0.9
""",
    )
    hp = data["hyperparameters"]
    assert hp["bare"] == 0.5 and hp["c"] == {"type": "const", "val": [1, 2]}
    assert hp["i"] == {"type": "int", "minval": 1, "maxval": 8, "count": 3}
    assert hp["d"] == {"type": "double", "minval": 0.0, "maxval": 0.5}
    assert hp["lg"]["base"] == 2  # Determined's base kept: 2^-4 .. 2^-1, not 10^...
    assert hp["cat"] == {"type": "categorical", "vals": ["adam", "sgd"]}
    assert hp["optimizer.lr"]["type"] == "log" and hp["optimizer.momentum"] == 0.9
    assert data["environment"]["vars"]["DLHPC_DETERMINED_NESTED"] == '["optimizer"]'
    cfg = load_experiment(tmp_path / "out" / "exp.yaml", searchers=SearcherTable())
    assert cfg.hyperparameters["lg"].base == 2.0


def test_the_stand_in_nests_flattened_hyperparameters_again() -> None:
    from dlhpc.integrations.determined.cluster import nest

    flat = {"optimizer.lr": 0.1, "optimizer.m.b": 2, "other.x": 1, "y": 3}
    assert nest(flat, '["optimizer"]') == {
        "optimizer": {"lr": 0.1, "m": {"b": 2}},
        "other.x": 1,
        "y": 3,
    }


@pytest.mark.parametrize(
    ("searcher", "want"),
    [
        ("{name: single, metric: m, max_length: 5}", {"name": "single", "max_length": 5}),
        (
            "{name: random, metric: acc, smaller_is_better: false, max_trials: 6,"
            " max_concurrent_trials: 2, max_length: {epochs: 3}}",
            {"name": "random", "max_trials": 6, "max_concurrent_trials": 2, "max_length": 3},
        ),
        (
            "{name: grid, metric: m, max_length: {records: 100}}",
            {"name": "grid", "max_concurrent_trials": 16},  # Determined's default, written
        ),
        (
            "{name: adaptive_asha, metric: m, max_trials: 9, max_length: {batches: 81},"
            " divisor: 3, max_rungs: 4, mode: aggressive}",
            {"name": "asha", "divisor": 3, "max_rungs": 4, "stop_once": False, "max_length": 81},
        ),
        (
            "{name: adaptive_asha, metric: m, max_trials: 9, time_metric: batches,"
            " max_time: 64, mode: aggressive}",
            {"name": "asha", "divisor": 4, "max_rungs": 5, "stop_once": True, "max_length": 64},
        ),
        (
            "{name: async_halving, metric: m, max_trials: 4, num_rungs: 2,"
            " max_length: {batches: 8}, divisor: 2}",
            {"name": "asha", "max_rungs": 2, "divisor": 2, "max_trials": 4},
        ),
    ],
)
def test_each_searcher(tmp_path: Path, searcher: str, want: dict[str, Any]) -> None:
    hp = "hyperparameters: {x: {type: int, minval: 1, maxval: 4, count: 2}}\n"
    data = _ok(tmp_path, f"name: t\nentrypoint: python3 train.py\n{hp}searcher: {searcher}\n")
    got = data["searcher"]
    assert {k: got[k] for k in want} == want, got
    assert got["smaller_is_better"] is ("smaller_is_better: false" not in searcher)
    env = data.get("environment", {}).get("vars", {})
    if "time_metric" in searcher:
        assert env["DLHPC_DETERMINED_TIME_METRIC"] == "batches"
    elif "{epochs" in searcher:
        assert env["DLHPC_DETERMINED_UNIT"] == "epochs"


def test_resources_restarts_checkpoints_entrypoint(tmp_path: Path) -> None:
    text = """\
name: t
entrypoint: python3 -m determined.launch.torch_distributed -- python3 train.py --flag 'a b'
searcher: {name: single, metric: m, max_length: 1}
resources: {slots_per_trial: 4}
max_restarts: 2
checkpoint_storage: {save_trial_best: 2, save_trial_latest: 3, save_experiment_best: 1,
                     type: shared_fs, host_path: /scratch, storage_path: ckpts}
environment: {environment_variables: [A=1, B=x=y]}
reproducibility: {experiment_seed: 11}
data: {url: s3://bucket}
"""
    data = _ok(tmp_path, text, "--slots-per-node", "2")
    # as in Determined: the string through sh -c, the launch layer kept, once per node
    assert data["entrypoint"] == (
        "python -m dlhpc.integrations.determined sh -c 'python3 -m"
        " determined.launch.torch_distributed -- python3 train.py --flag '\"'\"'a b'\"'\"''"
    )
    assert data["resources"] == {
        "nodes": 2,
        "gpus_per_node": 2,
        "tasks_per_node": 1,
        "cpus_per_task": 2,  # one per worker
    }
    assert data["max_restarts"] == 2
    assert data["checkpoint"] == {
        "keep_best": 2,
        "keep_latest": 3,
        "keep_experiment_best": 1,
        "dir": "/scratch/ckpts",
    }
    env = data["environment"]["vars"]
    assert env["A"] == "1" and env["B"] == "x=y"
    assert env["DLHPC_DETERMINED_USER_DATA"] == '{"url": "s3://bucket"}'
    assert env["DLHPC_DETERMINED_SLOTS_PER_NODE"] == "2"
    assert data["reproducibility"] == {"seed": 11}
    assert data["workdir"] == ".."  # the Determined context folder, relative to the output
    cpu = _ok(tmp_path, text, "--slot-type", "cpu")  # all on one node: CPUs for 4 workers
    assert cpu["resources"] == {
        "nodes": 1,
        "gpus_per_node": 0,
        "tasks_per_node": 1,
        "cpus_per_task": 4,
    }
    assert cpu["environment"]["vars"]["DLHPC_DETERMINED_SLOTS_PER_NODE"] == "4"
    as_list = "entrypoint: [python3, -m, determined.launch.deepspeed, python3, 'a b.py']"
    listed = _ok(tmp_path, text.replace(text.splitlines()[1], as_list))
    assert listed["entrypoint"] == (  # a list runs as it is
        "python -m dlhpc.integrations.determined python3 -m determined.launch.deepspeed"
        " python3 'a b.py'"
    )


def test_a_launch_layer_the_stand_in_has_not_or_a_trial_api_script_exits_2(
    tmp_path: Path,
) -> None:
    launcher = BASE.replace("python3 train.py", "python3 -m determined.launch.TAIL")
    for tail, why in (
        ("horovod python3 train.py", "determined.launch.horovod is not supported"),
        ("torch_distributed --trial model_def:T", "--trial (a Trial API class)"),
        ("torch_distributed --nproc_per_node 2 -- python3 t.py", "overrides"),
        ("deepspeed", "no command after"),
    ):
        res, out = _convert(tmp_path, launcher.replace("TAIL", tail))
        assert res.exit_code == 2 and why in res.stderr and not out.exists(), res.stderr
    (tmp_path / "train.py").write_text(
        "import determined as det\nfrom determined import core\n\n"
        "class T(det.pytorch.PyTorchTrial):\n    pass\n"
        "from determined.keras import DeterminedCallback\n"
    )
    res, out = _convert(tmp_path, BASE)
    assert res.exit_code == 2 and not out.exists()
    assert "train.py line 4 uses determined.pytorch" in res.stderr, res.stderr
    assert "train.py line 6 uses determined.keras" in res.stderr
    assert "det.core.init()" in res.stderr  # the Core API route
    (tmp_path / "train.py").write_text("import determined as det\nwith det.core.init():\n  pass\n")
    _ok(tmp_path, BASE)


def test_determineds_slurm_section(tmp_path: Path) -> None:
    text = BASE + (
        "resources: {slots_per_trial: 4}\n"
        "slurm: {gpu_type: a100, slots_per_node: 2, sbatch_args: [--exclude=node7]}\n"
    )
    data = _ok(tmp_path, text)
    assert data["resources"] == {
        "sbatch_args": ["--exclude=node7"],
        "nodes": 2,
        "gpus_per_node": "a100:2",
        "tasks_per_node": 1,
        "cpus_per_task": 2,
    }
    before = (tmp_path / "out" / "exp.yaml").read_text()
    res, out = _convert(tmp_path, BASE + "slurm:\n  sbatch_args: [--array=1-3]\n")
    assert res.exit_code == 2 and out.read_text() == before  # the old output stays as it was
    assert "det.yaml:5: slurm.sbatch_args:" in res.stderr, res.stderr  # dlhpc's loader refused


def test_what_cannot_be_translated_is_listed_never_dropped(tmp_path: Path) -> None:
    text = """\
name: t
entrypoint: python3 train.py
searcher: {name: adaptive_asha, metric: m, max_trials: 4, max_length: {batches: 16},
           mode: standard, bracket_rungs: [1, 2], source_trial_id: 3}
resources: {slots_per_trial: 0, resource_pool: a100s}
checkpoint_storage: {type: s3, bucket: b, save_trial_latest: 0}
environment: {image: my/image:1, environment_variables: [A=1]}
bind_mounts: [{host_path: /data, container_path: /data}]
min_validation_period: {batches: 100}
workspace: ws
labels: [x]
reproducibility: {experiment_seed: 1}
"""
    res, out = _convert(tmp_path, text)
    assert res.exit_code == 0, res.output
    listed = [
        "searcher.mode",
        "searcher.bracket_rungs",
        "searcher.source_trial_id",
        "resources.resource_pool",
        "checkpoint_storage.type",
        "checkpoint_storage.bucket",
        "checkpoint_storage.save_trial_latest",
        "environment.image",
        "bind_mounts",
        "min_validation_period",
        "workspace",
        "labels",
    ]
    head = [line for line in out.read_text().splitlines() if line.startswith("#")]
    for field in listed:
        assert any(f": {field}:" in line for line in head), (field, head)
        assert f": {field}:" in res.stderr, field
    assert "line 7: environment.image:" in res.stderr  # where it was
    assert yaml.safe_load(out.read_text())["checkpoint"] == {"keep_latest": 1}


@pytest.mark.parametrize(
    ("text", "where", "field"),
    [
        ("name: t\nentrypoint: [unclosed\n", ":3:", "flow sequence (line 2)"),
        ("- just\n- a list\n", ":1:", ""),
        (BASE.replace("name: single", "name: pbt"), ":3:", "searcher.name"),
        (BASE.replace("name: single", "name: bogus"), ":3:", "searcher.name"),
        (BASE + "max_restarts: many\n", ":4:", "max_restarts"),
        (BASE + "hyperparameters:\n  x: {type: uniform, minval: 0}\n", ":5:", "x.type"),
        (BASE + "hyperparameters:\n  x: {type: log, minval: 0, maxval: 1}\n", ":5:", "x"),
        (BASE + "hyperparameters:\n  x:\n    type: int\n    minval: 5\n    maxval: 1\n", ":7:", ""),
        (BASE.replace("python3 train.py", "model_def:MyTrial"), ":2:", "entrypoint"),
        (BASE + "resources: {slots_per_trial: two}\n", ":4:", "resources.slots_per_trial"),
        (BASE.replace("{batches: 10}", "{steps: 10}"), ":3:", "searcher.max_length"),
    ],
)
def test_bad_input_exits_2_with_file_line_and_field(
    tmp_path: Path, text: str, where: str, field: str
) -> None:
    res, out = _convert(tmp_path, text)
    assert res.exit_code == 2, res.output
    assert f"det.yaml{where}" in res.stderr and field in res.stderr, res.stderr
    assert not out.exists()  # nothing written


def test_the_output_is_never_the_input(tmp_path: Path) -> None:
    src = tmp_path / "det.yaml"
    src.write_text(BASE)
    res = CliRunner().invoke(cli, ["convert", "determined", str(src), "-o", str(src)])
    assert res.exit_code == 2 and src.read_text() == BASE


def test_the_example_asha_yaml_is_the_commands_output(tmp_path: Path) -> None:
    got = convert_determined(EXAMPLE / "determined.yaml", out_dir=EXAMPLE, slot_type="cpu")
    assert (EXAMPLE / "asha.yaml").read_text() == got.render()
    cfg = load_experiment(EXAMPLE / "asha.yaml", searchers=SearcherTable())
    assert cfg.searcher.name == "asha" and cfg.entrypoint.startswith(
        "python -m dlhpc.integrations.determined "
    )


def test_the_names_the_stand_in_reads_are_the_ones_convert_writes() -> None:
    import dlhpc.convert._sections as sections
    import dlhpc.convert.determined as conv
    import dlhpc.integrations.determined as shim

    assert conv.ENV_TIME_METRIC == shim.ENV_TIME_METRIC
    assert conv.ENV_UNIT == shim.ENV_UNIT
    assert conv.ENV_NESTED == shim.ENV_NESTED
    assert sections.ENV_USER_DATA == shim.ENV_USER_DATA
    assert sections.LAUNCHER.split()[-1] == shim.__name__
    assert sections.ENV_SLOTS == shim.ENV_SLOTS
    assert TRIAL_MODULES == shim.UNSUPPORTED_APIS
