"""dlhpc as a user installs it: the sdist built from the checkout, the wheel built from that
sdist, installed into a fresh venv outside the checkout, and used with no checkout on
``sys.path``.

- As an unprivileged user (``nobody`` when the tests run as root): the local quick start
  (``dlhpc example digits``, launch, follow, report), then one experiment on the dev
  cluster. The venv reuses the test interpreter's installed dependencies (a ``.pth`` line
  naming its site-packages, whose own ``.pth`` files, such as an editable dlhpc's, are not
  read), so torch is not downloaded; dlhpc itself comes from the wheel alone.
- As that user too, the other two ways the README installs it: ``pipx install`` of the
  wheel (pipx itself from the package index, in a throw-away venv), and ``pip install``
  of ``dlhpc @ git+file://`` a clone of the checkout (what ``git+https://`` does, but
  the fetch), each then run with no checkout on ``sys.path``.
- On each other supported Python (pyproject.toml's classifiers, found as
  ``scripts/test-pythons`` finds them: pyenv, else ``$PATH``): the wheel
  installed with its dependencies from the package index (no extras), ``dlhpc doctor`` and
  a local experiment of a script without torch.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from dlhpc._version import __version__
from tests._test_pythons import test_pythons as pythons
from tests.conftest import cluster_required
from tests.integration.conftest import REPO, let_others_pass

pytestmark = pytest.mark.cluster

SOURCES = ("pyproject.toml", "README.md", "dlhpc", "site-configs", "templates")
ONE_TRIAL = """\
name: wheel-one
entrypoint: python train.py
resources: {cpus_per_task: 1, mem: 1G, time: "00:10:00"}
hyperparameters: {lr: 0.1, hidden: 32, dropout: 0.1, batch_size: 64}
searcher: {name: single, metric: val_accuracy, smaller_is_better: false, max_length: 2}
"""
TINY_SCRIPT = """\
import dlhpc

ctx = dlhpc.init()
for epoch in range(1, ctx.max_length + 1):
    ctx.report(epoch, {"loss": ctx.hparams["lr"] / epoch})
ctx.close()
"""
TINY_EXPERIMENT = """\
name: tiny
entrypoint: python train.py
resources: {cpus_per_task: 1, mem: 1G, time: "00:05:00"}
hyperparameters: {lr: {type: categorical, vals: [0.1, 0.2]}}
searcher: {name: grid, metric: loss, smaller_is_better: true, max_length: 2}
"""


def _run(
    argv: Sequence[str | Path],
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    as_: pwd.struct_passwd | None = None,
) -> subprocess.CompletedProcess[str]:
    """``argv``, as user ``as_`` (no supplementary groups) when given; a failure is an
    AssertionError with the output."""
    proc = subprocess.run(
        argv,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        user=None if as_ is None else as_.pw_uid,
        group=None if as_ is None else as_.pw_gid,
        extra_groups=None if as_ is None else [],
    )
    cmd = " ".join(map(str, argv))
    assert proc.returncode == 0, f"{cmd} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def _pip_install(python: Path, *args: str | Path) -> None:
    """This interpreter's pip installs into ``python``'s environment. Without $PYTHONPATH:
    a checkout named there would count as dlhpc already installed."""
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check", "--python", python]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    _run([*pip, "install", *args], env=env)


def _build_wheel(work: Path) -> Path:
    """The sdist from a copy of the checkout's sources, then the wheel from that sdist."""
    src = work / "src"
    src.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():  # the package's data folders are links: kept as links
            shutil.copytree(REPO / name, src / name, symlinks=True)
        else:
            shutil.copy2(REPO / name, src / name)
    for cache in src.rglob("__pycache__"):
        shutil.rmtree(cache)
    dist = work / "dist"
    _run([sys.executable, "-m", "build", "-q", "--sdist", "--no-isolation", "-o", dist, src])
    (sdist,) = dist.glob("dlhpc-*.tar.gz")
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    _run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", dist, sdist])
    (wheel,) = dist.glob("dlhpc-*.whl")
    return wheel


@pytest.fixture(scope="module")
def wheel() -> Iterator[Path]:
    """The wheel, built once for this module's tests."""
    folder = Path(tempfile.mkdtemp(prefix="dlhpc-wheel-build-", dir="/tmp"))
    folder.chmod(0o755)
    yield _build_wheel(folder)
    shutil.rmtree(folder)


def _venv(work: Path, wheel: Path) -> Path:
    """A venv at ``work/venv`` with the wheel installed and this interpreter's packages
    reachable; returns its ``bin`` folder."""
    venv = work / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv])
    python = venv / "bin" / "python"
    site = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    for dep in (*deps, sys.base_prefix):  # the unprivileged user reads them
        let_others_pass(Path(dep) / "x")
    Path(site.stdout.strip(), "dev-deps.pth").write_text("".join(f"{d}\n" for d in deps))
    _pip_install(python, "--no-deps", "--no-index", wheel)
    return venv / "bin"


@pytest.fixture
def work() -> Iterator[Path]:
    """A folder outside the checkout and outside root's private temporary folders, so that
    the unprivileged user can use what is built there."""
    folder = Path(tempfile.mkdtemp(prefix="dlhpc-wheel-", dir="/tmp"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder)


class User:
    """Runs commands as the unprivileged user: this one, or ``nobody`` under root."""

    def __init__(self, env: dict[str, str], home: Path) -> None:
        self.ids = None if os.geteuid() else pwd.getpwnam("nobody")
        home.mkdir()
        self.env = {**env, "HOME": str(home)}
        if self.ids is not None:
            os.chown(home, self.ids.pw_uid, self.ids.pw_gid)
            self.env.update(USER=self.ids.pw_name, LOGNAME=self.ids.pw_name)

    def __call__(self, *argv: str | Path, cwd: Path, **env: str) -> str:
        """The command's stdout; a failure is an AssertionError with its output."""
        return _run(list(argv), cwd=cwd, env={**self.env, **env}, as_=self.ids).stdout


def test_the_wheel_works_outside_the_checkout_as_an_unprivileged_user(
    slurm_env: dict[str, str], work: Path, wheel: Path
) -> None:
    bin_ = _venv(work, wheel)
    home = work / "home"
    env = {k: v for k, v in slurm_env.items() if not k.startswith(("PYTHON", "DLHPC_", "VIRTUAL"))}
    env["PATH"] = f"{bin_}:{env['PATH']}"
    user = User(env, home)

    probe = "import dlhpc, json, sys; print(json.dumps([dlhpc.__file__, sys.path]))"
    where, paths = json.loads(user(bin_ / "python", "-c", probe, cwd=home))
    assert where.startswith(f"{work / 'venv'}/"), where  # the wheel's copy
    # no checkout on sys.path (the dependencies' site-packages may lie in its .venv)
    assert REPO not in [Path(p) for p in paths], paths
    assert user("dlhpc", "--version", cwd=home) == f"dlhpc, version {__version__}\n"

    # the README's laptop path (its grid is 4 trials of this script; one keeps the test
    # cheap): the local site, no Slurm
    user("dlhpc", "example", "digits", cwd=home)
    (work / "one.yaml").write_text(ONE_TRIAL)
    user("cp", work / "one.yaml", "digits/one.yaml", cwd=home)
    follow = ("--follow", "--interval", "1")
    me = pwd.getpwuid(os.geteuid()).pw_name if user.ids is None else user.ids.pw_name
    for site, backend in (("local", "local"), ("dev-cluster", "slurm")):  # then the cluster
        at = {"DLHPC_SITE": site, "DLHPC_HOME": str(home / site)}
        user("dlhpc", "launch", "digits/one.yaml", *follow, cwd=home, **at)
        status = json.loads(user("dlhpc", "status", "1", "--json", cwd=home, **at))
        exp = status["experiments"][0]
        assert (exp["state"], exp["backend"], exp["user"]) == ("COMPLETED", backend, me), exp
    user("dlhpc", "report", "1", "-o", "digits.html", cwd=home, DLHPC_HOME=str(home / "local"))
    assert "val_accuracy" in (home / "digits.html").read_text()


def _no_checkout(user: User, python: Path, under: Path, home: Path) -> None:
    """``python`` imports dlhpc from under ``under``, with no checkout on ``sys.path``."""
    probe = "import dlhpc, json, sys; print(json.dumps([dlhpc.__file__, sys.path]))"
    where, paths = json.loads(user(python, "-c", probe, cwd=home))
    assert where.startswith(f"{under}/"), where
    assert REPO not in [Path(p) for p in paths], paths


def test_pipx_and_a_git_url_install_it_as_an_unprivileged_user(work: Path, wheel: Path) -> None:
    tools = work / "tools"  # pipx, from the package index, in a throw-away venv
    _run([sys.executable, "-m", "venv", "--without-pip", tools])
    _pip_install(tools / "bin" / "python", "pipx")
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    for folder in (*deps, sys.base_prefix):  # the user's venvs run this interpreter
        let_others_pass(Path(folder) / "x")
    home = work / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "DLHPC_", "VIRTUAL"))}
    user = User(env, home)
    version = f"dlhpc, version {__version__}\n"

    # pipx install of the wheel: its own venv, the dependencies from the package index
    pipx = {"PIPX_HOME": str(home / "pipx"), "PIPX_BIN_DIR": str(home / "bin")}
    user(tools / "bin" / "pipx", "install", wheel, cwd=home, **pipx)
    own = Path(pipx["PIPX_HOME"], "venvs", "dlhpc")
    _no_checkout(user, own / "bin" / "python", own, home)
    dlhpc = Path(pipx["PIPX_BIN_DIR"], "dlhpc")
    assert user(dlhpc, "--version", cwd=home) == version
    listed = user(dlhpc, "example", "--list", cwd=home).splitlines()
    assert {"digits", "argparse"} <= {line.split()[0] for line in listed}, listed

    # pip install of a git URL: a clone the user owns, fetched and built by pip (the
    # dependencies from this interpreter's site-packages, as in the first test)
    clone = work / "clone"
    _run(["git", "clone", "-q", "--no-hardlinks", REPO, clone])
    if user.ids is not None:  # git refuses a repository another user owns
        _run(["chown", "-R", f"{user.ids.pw_uid}:{user.ids.pw_gid}", clone])
    venv = home / "venv"
    user(sys.executable, "-m", "venv", "--without-pip", venv, cwd=home)
    site = user(
        venv / "bin" / "python", "-c", "import site; print(site.getsitepackages()[0])", cwd=home
    )
    Path(site.strip(), "dev-deps.pth").write_text("".join(f"{d}\n" for d in deps))
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    user(
        *pip,
        "--python",
        venv / "bin" / "python",
        "install",
        f"dlhpc @ git+file://{clone}",
        cwd=home,
    )
    _no_checkout(user, venv / "bin" / "python", venv, home)
    at = {"DLHPC_HOME": str(home / "git-home")}
    assert user(venv / "bin" / "dlhpc", "--version", cwd=home) == version
    user(venv / "bin" / "dlhpc", "doctor", "--site", "local", cwd=home, **at)


# each supported Python (pyproject.toml's classifiers) but this one, which the first test covers
@pytest.mark.parametrize(
    "version", [v for v in pythons.supported() if v != "{}.{}".format(*sys.version_info[:2])]
)
def test_the_wheel_on_each_supported_python(version: str, wheel: Path, tmp_path: Path) -> None:
    python = pythons.interpreter(version)
    if python is None:
        why = f"no Python {version} (pyenv or python{version} on $PATH)"
        if cluster_required():
            pytest.fail(why)
        pytest.skip(why)
    venv = tmp_path / "venv"
    _run([python, "-m", "venv", "--without-pip", venv])  # this pip installs into it
    _pip_install(venv / "bin" / "python", wheel)
    keep = ("PATH", "LANG", "LC_ALL", "TMPDIR")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env.update(
        PATH=f"{venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}",
        HOME=str(tmp_path),
        DLHPC_HOME=str(tmp_path / "home"),
        DLHPC_SITE="local",
    )
    probe = (venv / "bin" / "python", "-c", "import dlhpc; print(dlhpc.__file__)")
    where = _run(probe, cwd=tmp_path, env=env)  # not the checkout: -c puts the cwd first
    assert where.stdout.startswith(f"{venv}/"), where.stdout
    _run(["dlhpc", "doctor"], cwd=tmp_path, env=env)
    exp = tmp_path / "exp"
    exp.mkdir()
    (exp / "train.py").write_text(TINY_SCRIPT)
    (exp / "exp.yaml").write_text(TINY_EXPERIMENT)
    _run(
        ["dlhpc", "launch", "exp/exp.yaml", "--follow", "--interval", "0.5"], cwd=tmp_path, env=env
    )
    status = json.loads(_run(["dlhpc", "status", "1", "--json"], cwd=tmp_path, env=env).stdout)
    assert status["experiments"][0]["state"] == "COMPLETED", status
