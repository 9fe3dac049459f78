"""Entrypoint templates: parsing, filling, config validation and entry.sh (plain scripts)."""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from dlhpc._argv_template import fill, format_value, is_template, placeholders, split_template
from dlhpc.config.serde import from_jsonable, to_jsonable
from dlhpc.errors import ConfigError
from dlhpc.orchestrator.runfiles import entry_script_text
from tests._config import load_experiment

HOSTILE = ["a b", 'it\'s "quoted"', "$(touch PWNED)", "; touch PWNED2", "`touch PWNED3`", "\n"]


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    (tmp_path / "home").mkdir()
    monkeypatch.chdir(tmp_path)
    return {"HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin", "USER": "alice"}


def _yaml(entrypoint: str, extra: str = "") -> str:
    return (
        f"name: t\nentrypoint: {entrypoint}\n"
        "hyperparameters:\n  lr: {type: log, minval: -4, maxval: -1}\n  batch_size: 32\n"
        "searcher: {name: random, metric: val_loss, max_trials: 2, max_length: 3}\n" + extra
    )


def _errors(env: dict[str, str], text: str) -> list[str]:
    Path("exp.yaml").write_text(text)
    with pytest.raises(ConfigError) as info:
        load_experiment("exp.yaml", environ=env)
    assert info.value.exit_code == 2
    return str(info.value).splitlines()


def test_placeholders_and_braces() -> None:
    assert placeholders("python t.py --lr {lr} --x={seed}{lr}") == ["lr", "seed", "lr"]
    assert not is_template("echo ${HOME} {1..3} {} {{lr}}")  # shell lines stay shell lines
    assert fill(["--a={{lr}}", "{lr}"], {"lr": 0.5}) == ["--a={lr}", "0.5"]


def test_values_are_formatted_deterministically() -> None:
    assert [format_value(v) for v in (1e-05, 0.001, 3, True, "x y", None, [1, "a"])] == [
        "1e-05",
        "0.001",
        "3",
        "True",
        "x y",
        "",
        '[1,"a"]',
    ]
    assert float(format_value(0.1 + 0.2)) == 0.1 + 0.2  # repr reads back exactly


def test_hostile_values_stay_one_argv_item_each_and_never_reach_a_shell(tmp_path: Path) -> None:
    tokens = split_template("printf '%s\\n' '--name={name}' {name} --lr={lr}")
    for value in HOSTILE:
        argv = fill(tokens, {"name": value, "lr": 0.1})
        assert argv == ["printf", "%s\\n", f"--name={value}", value, "--lr=0.1"]
        out = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, check=True)
        assert out.stdout == f"--name={value}\n{value}\n--lr=0.1\n"
    assert not list(tmp_path.glob("PWNED*"))


def test_unknown_placeholder_is_exit_2_with_line_field_and_valid_names(
    env: dict[str, str],
) -> None:
    (line,) = _errors(env, _yaml("python t.py --lr {lr} --bs {batch_sze}"))
    assert line.startswith("exp.yaml:2: entrypoint: placeholder {batch_sze} names no")
    assert "did you mean 'batch_size'?" in line
    assert "hyperparameters: batch_size, lr;" in line and "checkpoint_dir" in line


def test_template_shell_syntax_quotes_and_resume_folder_are_checked(env: dict[str, str]) -> None:
    assert (
        "runs without a shell and '&&' is shell syntax"
        in _errors(env, _yaml("python t.py --lr {lr} && echo done"))[0]
    )
    assert "'$HOME' expands nothing" in _errors(env, _yaml("python t.py {lr} $HOME"))[0]
    assert (
        "must split into words: No closing quotation"
        in _errors(env, _yaml('"python t.py {lr} \'x"'))[0]
    )
    assert (
        "{checkpoint} (the checkpoint to resume from) needs {checkpoint_dir}"
        in _errors(env, _yaml("python t.py --resume {checkpoint}"))[0]
    )


def test_hyperparameter_named_like_a_dlhpc_name_is_refused_in_a_template(
    env: dict[str, str],
) -> None:
    text = _yaml("python t.py --seed {seed}").replace("  batch_size: 32\n", "  seed: 3\n")
    (line,) = _errors(env, text)
    assert line.startswith("exp.yaml:5: hyperparameters.seed: {seed} is a name dlhpc")


def test_metrics_pattern_must_compile_and_name_step_and_the_metric(env: dict[str, str]) -> None:
    bad = _yaml("python t.py", "script:\n  metrics: {pattern: 'loss (?P<val_loss>[0-9.]+'}\n")
    (line,) = _errors(env, bad)
    assert line.startswith("exp.yaml:8: script.metrics.pattern: is not a valid regular")
    missing = _yaml("python t.py", "script:\n  metrics: {pattern: 'loss (?P<loss>[0-9.]+)'}\n")
    (line,) = _errors(env, missing)
    assert "needs named groups (?P<step>...), (?P<val_loss>...)" in line
    assert "it has: loss" in line
    (line,) = _errors(env, _yaml("python t.py", "script: {metric: x}\n"))
    assert "exp.yaml:7: script.metric: unknown key; did you mean 'metrics'?" in line


def test_entry_sh_runs_the_runner_with_quoted_tokens_and_no_values(
    env: dict[str, str], tmp_path: Path
) -> None:
    pattern = r"epoch (?P<step>\d+) val_loss=(?P<val_loss>\S+)"
    text = _yaml(
        "python 'my train.py' --lr={lr} --bs {batch_size} --resume {checkpoint}"
        " --ckpt-dir {checkpoint_dir}",
        f"script:\n  metrics:\n    pattern: '{pattern}'\n",
    )
    Path("exp.yaml").write_text(text)
    cfg = load_experiment("exp.yaml", environ=env)
    assert cfg.script.enabled and cfg.script.metrics_pattern == pattern
    assert from_jsonable(type(cfg), to_jsonable(cfg)) == cfg
    entry = entry_script_text(cfg, 4)
    last = entry.rstrip("\n").splitlines()[-1]
    assert last.startswith('exec "${DLHPC_PYTHON:-python}" -m dlhpc.integrations.script')
    # bash hands the runner exactly the template's tokens (quotes resolved, nothing expanded)
    script = tmp_path / "entry.sh"
    script.write_text(entry)
    spy = tmp_path / "py"
    spy.write_text('#!/bin/sh\nfor a in "$@"; do printf \'%s\\n\' "$a"; done\n')
    spy.chmod(0o755)
    out = subprocess.run(
        ["bash", str(script)],
        env={**os.environ, "DLHPC_PYTHON": str(spy)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert out == [
        "-m",
        "dlhpc.integrations.script",
        "--metrics-pattern",
        pattern,
        "--",
        "python",
        "my train.py",
        "--lr={lr}",
        "--bs",
        "{batch_size}",
        "--resume",
        "{checkpoint}",
        "--ckpt-dir",
        "{checkpoint_dir}",
    ]


def test_a_plain_shell_entrypoint_is_unchanged(env: dict[str, str]) -> None:
    Path("exp.yaml").write_text(_yaml("cd sub && python t.py --home ${HOME}"))
    cfg = load_experiment("exp.yaml", environ=env)
    assert not cfg.script.enabled
    assert entry_script_text(cfg, 1).rstrip("\n").endswith("cd sub && python t.py --home ${HOME}")
    Path("exp.yaml").write_text(_yaml("python t.py", "script: {}\n"))
    assert load_experiment("exp.yaml", environ=env).script.enabled  # runner without placeholders


def test_template_with_newline_keeps_entry_sh_comment_on_one_line(env: dict[str, str]) -> None:
    text = _yaml("|\n  python t.py --lr {lr}\n  --bs {batch_size}")
    Path("exp.yaml").write_text(textwrap.dedent(text))
    cfg = load_experiment("exp.yaml", environ=env)
    entry = entry_script_text(cfg, 1)
    assert "# python t.py --lr {lr} --bs {batch_size}\n" in entry
    assert "--bs '{batch_size}'\n" in entry
