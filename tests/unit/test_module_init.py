"""The job script's setup section sources the site's module system when a setup line
runs ``module`` and the batch shell has none (a launch from a shell without Lmod's
``module`` function); an inherited ``module`` is left alone. The module system here is
a stand-in init script under ``$MODULESHOME`` (the real Lmod: test_lmod_cluster.py)."""

from __future__ import annotations

from pathlib import Path

from tests.unit.test_job_setup import render, request, run_script

INIT = """\
module() {
  [ "$1" = load ] || return 0
  [ "$2" != nosuch ] || { echo "Lmod has detected the following error: $2" >&2; return 1; }
  export LOADEDMODULES="${LOADEDMODULES:+$LOADEDMODULES:}$2"
}
echo sourced >> "$INIT_LOG"
"""


def _home(tmp_path: Path) -> Path:
    home = tmp_path / "lmod"
    (home / "init").mkdir(parents=True)
    (home / "init" / "bash").write_text(INIT, encoding="utf-8")
    return home


def _run(tmp_path: Path, lines: tuple[str, ...], prefix: str = "") -> tuple[int, str, str]:
    home, log = _home(tmp_path), tmp_path / "init.log"
    text = render(request(tmp_path, (("site modules", lines),)))
    # the variables a launch from a shell with MODULESHOME but no function would pass
    head, sep, tail = text.partition("if ! type module")
    text = f"{head}export MODULESHOME={home} INIT_LOG={log}\n{prefix}{sep}{tail}"
    job = run_script(text, tmp_path)
    sourced = log.read_text() if log.exists() else ""
    return job.returncode, job.stdout + job.stderr, sourced


def test_no_module_line_no_init(tmp_path: Path) -> None:
    text = render(request(tmp_path, (("site modules", ("export X=1", "echo modules")),)))
    assert "type module" not in text


def test_a_shell_without_module_sources_the_site_init_first(tmp_path: Path) -> None:
    code, out, sourced = _run(tmp_path, ("module load cuda/12.1", "ml_not_a_module=1"))
    assert code == 0, out
    assert sourced == "sourced\n" and "LOADEDMODULES=cuda/12.1" in out  # the worker's env


def test_an_inherited_module_function_is_kept(tmp_path: Path) -> None:
    own = "module() { export LOADEDMODULES=inherited; }\n"
    code, out, sourced = _run(tmp_path, ("module load cuda/12.1",), prefix=own)
    assert code == 0, out
    assert sourced == "" and "LOADEDMODULES=inherited" in out


def test_a_failing_module_load_after_the_init_fails_the_setup(tmp_path: Path) -> None:
    code, out, _ = _run(tmp_path, ("module load cuda/12.1", "module load nosuch"))
    assert code == 1 and "SRUN-RAN" not in out
    assert "setup failed: site modules line 2: module load nosuch (exit 1)" in out
