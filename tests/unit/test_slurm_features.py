"""``dlhpc doctor``'s Slurm version and feature lines against the ``scontrol show config``
text of Slurm 22.05 and 24.11 (fake commands first on PATH), and through the CLI."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dlhpc.scheduler.slurm.features import feature_checks, parse_config
from tests.unit._cli import run

# trimmed from `scontrol show config` of the dev cluster's 22.05.8 and of 24.11.5
CONFIG_2205 = """Configuration data as of 2026-11-25T12:00:00
AccountingStorageHost   = localhost
AccountingStorageType   = accounting_storage/slurmdbd
JobRequeue              = 1
MaxArraySize            = 1001
ScronParameters         = (null)
SelectType              = select/cons_tres
SelectTypeParameters    = CR_CORE
SLURM_VERSION           = 22.05.8
"""
CONFIG_2411 = """Configuration data as of 2026-11-25T12:00:01
AccountingStorageType   = accounting_storage/none
JobRequeue              = 0
ScronParameters         = enable,explicit_scancel
SelectType              = select/cons_tres
SLURM_VERSION           = 24.11.5
"""
STRICT = """JobRequeue              = 1
JobSubmitPlugins        = lua"""
CONFIG_OLD = """Configuration data as of 2020-01-01T00:00:00
JobRequeue              = 1
SelectType              = select/cons_res
SLURM_VERSION           = 20.02.7
"""


def _by_name(text: str) -> dict[str, tuple[str, str]]:
    return {c.name: (c.status, c.detail) for c in feature_checks(lambda cmd: (0, text))}


def test_parse_config() -> None:
    config = parse_config(CONFIG_2205)
    assert config["SLURM_VERSION"] == "22.05.8" and config["ScronParameters"] == ""
    assert config["SelectType"] == "select/cons_tres"


def test_2205_scrontab_disabled() -> None:
    got = _by_name(CONFIG_2205)
    assert got["slurm version"] == ("ok", "22.05.8")
    assert got["gpus per node (cons_tres)"][0] == "ok"
    status, detail = got["scrontab"]
    assert status == "warn" and "ScronParameters=enable" in detail and "dlhpc cron" in detail
    assert got["job requeue"][0] == "ok"


def test_2411_scrontab_enabled_no_default_requeue() -> None:
    got = _by_name(CONFIG_2411)
    assert got["slurm version"] == ("ok", "24.11.5")
    assert got["scrontab"][0] == "ok" and "--scrontab" in got["scrontab"][1]
    status, detail = got["job requeue"]
    assert status == "warn" and "JobRequeue=0" in detail and "fix" in detail


def test_a_job_submit_plugin_is_named_as_a_possible_requeue_denial() -> None:
    """The dev cluster's strict profile (as 22.05 prints it): a job_submit.lua may make jobs not
    requeueable, which `scontrol show config` cannot tell; doctor says what then happens."""
    status, detail = _by_name(CONFIG_2411.replace("JobRequeue              = 0", STRICT))[
        "job requeue"
    ]
    assert status == "ok" and "JobSubmitPlugins=lua" in detail and "submits the trial" in detail
    assert "JobSubmitPlugins" not in _by_name(CONFIG_2205)["job requeue"][1]


def test_old_slurm_cons_res_and_no_scrontab() -> None:
    got = _by_name(CONFIG_OLD)
    status, detail = got["gpus per node (cons_tres)"]
    assert status == "warn" and "select/cons_res" in detail and "fix" in detail
    assert got["scrontab"][0] == "warn" and "no scrontab" in got["scrontab"][1]


def test_scontrol_failing_is_one_warning() -> None:
    (check,) = feature_checks(lambda cmd: (1, "slurm_load_ctl_conf error: Unable to contact"))
    assert check.status == "warn" and "Unable to contact" in check.detail


@pytest.mark.parametrize(
    ("config", "version"), [(CONFIG_2205, "22.05.8"), (CONFIG_2411, "24.11.5")]
)
def test_doctor_cli_shows_version_and_features(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch, config: str, version: str
) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (tmp_path / "config.txt").write_text(config, encoding="utf-8")
    fakes = {
        "sinfo": "echo 'debug*'",
        "sacct": "exit 0",
        "scontrol": f"cat {tmp_path}/config.txt",
        "sbatch": "exit 1",
        "sacctmgr": "exit 0",  # the limits: a real one would ask a running cluster's slurmdbd
    }
    for name, body in fakes.items():
        (bindir / name).write_text(f"#!/bin/sh\n{body}\n", encoding="utf-8")
        (bindir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    site = tmp_path / "site.yaml"
    site.write_text(f"name: s\nbackend: slurm\nstate_dir: {home}\n", encoding="utf-8")
    res = run("doctor", "--site", str(site), "--json")
    checks = {c["name"]: c for c in json.loads(res.output)["checks"]}
    assert checks["slurm version"]["detail"] == version
    assert {"gpus per node (cons_tres)", "scrontab", "job requeue", "accounting (sacct)"} <= set(
        checks
    )
