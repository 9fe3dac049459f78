"""A real Lmod (Debian's ``lmod``, installed by scripts/test) on the dev cluster: the
site's ``modules`` lines load a modulefile the test writes into its own MODULEPATH, the
job sees what it sets, a failing ``module load`` fails the attempt with cause ``setup``,
the attempt's reproducibility record lists the modules really in effect, and ``dlhpc
diff`` shows two trials' modules apart.

As on a real site, the launch runs in a login shell's environment: /etc/profile.d/lmod.sh
defined ``module`` and exported it (``BASH_FUNC_module%%``, ``BASH_ENV``), and the job
inherits it (``--export=ALL`` with the launch's saved environment). A launch from a shell
without it makes the job script source the site's init itself (the second test).
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path

import pytest

from dlhpc.states import TERMINAL_EXPERIMENT_STATES as TERMINAL
from tests.integration.conftest import REPO, Cli

pytestmark = pytest.mark.cluster

LMOD_INIT = Path("/etc/profile.d/lmod.sh")
_LMOD_VARS = ("BASH_FUNC_", "BASH_ENV", "LMOD", "MODULE", "LOADEDMODULES", "_LMFILES_")

MODULEFILE = """\
setenv("DLHPC_TEST_MODULE", "loaded-{version}")
prepend_path("PATH", "{bin}")
"""

TRAIN = """\
import json, os, shutil
from pathlib import Path
import dlhpc

ctx = dlhpc.init()
out = Path(ctx.checkpoint_dir); out.mkdir(parents=True, exist_ok=True)
seen = {k: os.environ.get(k) for k in ("DLHPC_TEST_MODULE", "LOADEDMODULES")}
seen["tool"] = shutil.which("dlhpc-test-tool")
(out / "seen.json").write_text(json.dumps(seen))
ctx.report(1, {"loss": 0.5})
ctx.close()
"""


@pytest.fixture
def modules(tmp_path: Path) -> Path:
    """A MODULEPATH folder with dlhpctest/1.0 and dlhpctest/2.0 (each prepends its own
    bin folder, holding ``dlhpc-test-tool``, to PATH)."""
    if not LMOD_INIT.exists():
        pytest.skip("Lmod is not installed (scripts/test installs Debian's lmod package)")
    root = tmp_path / "modulefiles"
    for version in ("1.0", "2.0"):
        bin_dir = tmp_path / f"tool-{version}" / "bin"
        bin_dir.mkdir(parents=True)
        tool = bin_dir / "dlhpc-test-tool"
        tool.write_text("#!/bin/sh\necho tool\n")
        tool.chmod(0o755)
        (root / "dlhpctest").mkdir(parents=True, exist_ok=True)
        (root / "dlhpctest" / f"{version}.lua").write_text(
            MODULEFILE.format(version=version, bin=bin_dir)
        )
    return root


def _without_lmod(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if not k.startswith(_LMOD_VARS)}


def _login_env(env: dict[str, str]) -> dict[str, str]:
    """What a login shell adds to ``env``: /etc/profile.d/lmod.sh's variables, the
    exported ``module`` function included."""
    out = subprocess.run(
        ["bash", "-c", f". {LMOD_INIT} >/dev/null && env -0"],
        env=_without_lmod(env),
        capture_output=True,
        check=True,
    ).stdout.decode()
    got = dict(item.split("=", 1) for item in out.split("\0") if "=" in item)
    assert "BASH_FUNC_module%%" in got, sorted(got)
    return {k: v for k, v in got.items() if env.get(k) != v}


def _launch(cli: Cli, tmp_path: Path, name: str, lines: list[str], **env: str) -> int:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "train.py").write_text(TRAIN, encoding="utf-8")
    text = (REPO / "site-configs" / "dev-cluster.yaml").read_text(encoding="utf-8")
    site = folder / "site.yaml"
    site.write_text(
        text.replace("name: dev-cluster", f"name: {name}")
        + "modules:\n"
        + "".join(f"  - {json.dumps(line)}\n" for line in lines)
    )
    exp = folder / "exp.yaml"
    exp.write_text(
        f"name: {name}\nentrypoint: python train.py\nmax_restarts: 0\n"
        "resources: {cpus_per_task: 1, mem: 500M, time: '00:05:00'}\n",
        encoding="utf-8",
    )
    out = cli("launch", str(exp), "--site", str(site), "--json", check=True, **env)
    return int(json.loads(out.stdout)["experiment_id"])


def _rows(home: Path, exp_id: int) -> list[tuple[str, str, str]]:
    with sqlite3.connect(home / "dlhpc.db") as db:
        return db.execute(
            "SELECT a.cause, a.env_json, t.error FROM attempts a JOIN trials t"
            " ON t.id = a.trial_id WHERE t.experiment_id = ?",
            (exp_id,),
        ).fetchall()


def test_a_real_lmod_module_is_in_effect_in_the_job_and_in_its_record(
    slurm_env: dict[str, str], tmp_path: Path, modules: Path
) -> None:
    cli = Cli(_without_lmod(slurm_env), tmp_path / "home")
    login = _login_env(cli.env)
    ids = {
        v: _launch(
            cli,
            tmp_path,
            f"lmod-{v}",
            [f"module use {modules}", f"module load dlhpctest/{v}"],
            **login,
        )
        for v in ("1.0", "2.0")
    }
    trials = {}
    for version, exp_id in ids.items():
        done = cli.tick_until(exp_id, lambda e: e["state"] in TERMINAL)
        assert done["state"] == "COMPLETED", done
        (trial,) = done["trials"]
        trials[version] = trial["id"]
        (seen_file,) = (cli.home / "scratch").rglob(f"exp-{exp_id:06d}-*/*/seen.json")
        seen = json.loads(seen_file.read_text())
        assert seen == {
            "DLHPC_TEST_MODULE": f"loaded-{version}",
            "LOADEDMODULES": f"dlhpctest/{version}",
            "tool": str(tmp_path / f"tool-{version}" / "bin" / "dlhpc-test-tool"),
        }
        ((cause, env_json, _),) = _rows(cli.home, exp_id)
        assert cause == "completed"
        record = json.loads(env_json)["modules"]
        assert record == {
            "loaded": [f"dlhpctest/{version}"],
            "files": [str(modules / "dlhpctest" / f"{version}.lua")],
        }
    out = cli.json("diff", str(trials["1.0"]), str(trials["2.0"]))
    got = {(d["section"], d["item"]): (d["a"], d["b"]) for d in out["differences"]}
    assert got[("modules", "job: dlhpctest")] == ("dlhpctest/1.0", "dlhpctest/2.0")


def test_without_an_inherited_module_the_job_sources_lmod_and_a_bad_load_fails_it(
    slurm_env: dict[str, str], tmp_path: Path, modules: Path
) -> None:
    cli = Cli(_without_lmod(slurm_env), tmp_path / "home")  # no module function
    lines = [f"module use {modules}", "module load dlhpctest/1.0", "module load nosuchmodule"]
    exp_id = _launch(cli, tmp_path, "lmod-bad", lines)
    done = cli.tick_until(exp_id, lambda e: e["state"] in TERMINAL)
    (trial,) = done["trials"]
    assert trial["state"] == "FAILED", done
    ((cause, _, error),) = _rows(cli.home, exp_id)
    # lines 1 and 2 ran: the job script found Lmod's init although the launch had none
    assert cause == "setup"
    assert "setup failed: site modules line 3: module load nosuchmodule (exit 1)" in error
