"""The broken-config corpus (tests/data/broken-configs) through the real ``dlhpc launch``.

Every file must give exit code 2, a one-line-per-problem message naming the
file, the line and the field, no traceback, and leave nothing behind: no
state database, no run folder, no Slurm command other than ``sinfo`` (the
partition check). Slurm is a fake here (scripts on ``$PATH`` that log their
calls); tests/integration/test_config_cluster.py does the same on the real cluster.

A corpus file states its expectation on its first line::

    # expect: <line> <field> <substring of the message>

``<line>`` and ``<field>`` are ``-`` when the message has none: file-level
problems where YAML has no line (an empty or comment-only file, a document
too large once aliases are expanded, nesting too deep in block style) and
missing required keys (absent, so no line) name the file only. Files that
cannot hold a comment (empty, binary, UTF-16) are in :data:`SIDECAR`; their
message names line 1 when a byte could be pointed at, else the file only.
``experiment/*.yaml`` are launched as they are (on the ``local`` site unless
they name one); ``site/*.yaml`` are launched as ``--site`` of ``ok/experiment.yaml``.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from dlhpc.cli.main import cli

CORPUS = Path(__file__).resolve().parents[1] / "data" / "broken-configs"
SLURM_COMMANDS = ("sbatch", "squeue", "sacct", "scontrol", "scancel", "srun", "salloc")

#: Files without a header line: relative path -> (line, field, substring).
SIDECAR = {
    "experiment/empty.yaml": ("-", "-", "file is empty"),
    "experiment/binary-elf.yaml": ("1", "-", "unprintable character '\\x7f'"),
    "experiment/binary-png.yaml": ("1", "-", "not UTF-8 text (byte 0x89); is it a binary file?"),
    "experiment/binary-gzip.yaml": ("1", "-", "not UTF-8 text (byte 0x8b)"),
    "experiment/utf16.yaml": ("1", "-", "not UTF-8 text (byte 0xff)"),
    "site/empty.yaml": ("-", "-", "file is empty"),
    "site/binary-zeros.yaml": ("1", "-", "unprintable character '\\x00'"),
}
_HEADER = re.compile(rb"# expect: (\S+) (\S+) (.+)\n")


@dataclass(frozen=True)
class Case:
    rel: str
    line: str
    field: str
    text: str


def _cases() -> list[Case]:
    out = []
    for path in sorted(CORPUS.glob("*/*.yaml")):
        rel = path.relative_to(CORPUS).as_posix()
        if rel.startswith("ok/"):
            continue
        if rel in SIDECAR:
            out.append(Case(rel, *SIDECAR[rel]))
            continue
        match = _HEADER.match(path.read_bytes())
        assert match is not None, f"{rel}: no '# expect:' header and not in SIDECAR"
        line, field, text = (g.decode() for g in match.groups())
        out.append(Case(rel, line, field, text))
    return out


CASES = _cases()


def test_the_corpus_is_large_and_covers_both_kinds() -> None:
    kinds = {c.rel.split("/")[0] for c in CASES}
    assert len(CASES) >= 60 and kinds == {"experiment", "site"}
    assert set(SIDECAR) <= {c.rel for c in CASES}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the corpus plus what git cannot hold well (a dangling symlink)."""
    root = tmp_path_factory.mktemp("corpus") / "broken-configs"
    shutil.copytree(CORPUS, root, symlinks=True)
    (root / "ok" / "dangling").symlink_to(root / "ok" / "nowhere")
    return root


@pytest.fixture
def slurm_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Fake Slurm commands first on $PATH; each appends its name to the returned log.
    ``sinfo`` answers partitions ``debug`` and ``high``, like the dev cluster."""
    bin_dir, log = tmp_path / "fake-slurm", tmp_path / "slurm-calls.log"
    bin_dir.mkdir()
    for name in (*SLURM_COMMANDS, "sinfo"):
        answer = "printf 'debug\\nhigh\\n'\n" if name == "sinfo" else "exit 1\n"
        script = bin_dir / name
        script.write_text(f"#!/bin/sh\necho {name} >> '{log}'\n{answer}")
        script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.delenv("DLHPC_SITE_PATH", raising=False)
    monkeypatch.delenv("DLHPC_TEST_SURELY_UNDEFINED", raising=False)
    return log


@pytest.mark.parametrize("case", CASES, ids=[c.rel for c in CASES])
def test_broken_file_exits_2_naming_file_line_and_field(
    case: Case,
    corpus: Path,
    home: Path,
    slurm_log: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DLHPC_SITE", "local")  # a `site:` key in the file wins over it
    monkeypatch.chdir(tmp_path)
    file = corpus / case.rel
    if case.rel.startswith("site/"):
        args = ["launch", str(corpus / "ok" / "experiment.yaml"), "--site", str(file)]
    else:
        args = ["launch", str(file)]

    result = CliRunner().invoke(cli, args)

    out = result.output
    assert result.exit_code == 2, out
    assert "Traceback" not in out and "internal error" not in out, out
    where = str(file) if case.line == "-" else f"{file}:{case.line}"
    prefix = f"error: {where}: " + ("" if case.field == "-" else f"{case.field}: ")
    lines = out.splitlines()
    assert all(line.startswith("error: ") for line in lines), out
    assert any(line.startswith(prefix) and case.text in line for line in lines), (
        f"expected a line starting {prefix!r} containing {case.text!r}, got:\n{out}"
    )
    # Nothing happened: no state folder, no sbatch (only sinfo may have been asked).
    assert not home.exists(), sorted(home.rglob("*"))
    calls = slurm_log.read_text().split() if slurm_log.exists() else []
    assert set(calls) <= {"sinfo"} and len(calls) <= 1, calls
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "fake-slurm",
        *(["slurm-calls.log"] if calls else []),
    ]


def _launch_unknown_partition(corpus: Path, *extra: str) -> tuple[int, str]:
    exp = corpus / "experiment" / "partition-unknown-to-slurm.yaml"
    result = CliRunner().invoke(cli, ["launch", str(exp), *extra])
    return result.exit_code, result.output


def test_slurm_not_answering_the_partition_check_is_exit_1_and_nothing_happens(
    corpus: Path, home: Path, slurm_log: Path, tmp_path: Path
) -> None:
    (tmp_path / "fake-slurm" / "sinfo").write_text(
        f"#!/bin/sh\necho sinfo >> '{slurm_log}'\necho 'slurm_load_partitions: down' >&2\nexit 1\n"
    )
    code, out = _launch_unknown_partition(corpus)
    assert code == 1 and out == "error: sinfo failed (exit 1): slurm_load_partitions: down\n"
    assert not home.exists() and slurm_log.read_text().split() == ["sinfo"]


def test_a_dry_run_checks_partitions_only_where_sinfo_is_installed(
    corpus: Path, home: Path, slurm_log: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "fake-slurm"))  # no real Slurm either
    code, out = _launch_unknown_partition(corpus, "--dry-run")
    assert code == 2 and "partition 'nope' does not exist" in out
    (tmp_path / "fake-slurm" / "sinfo").unlink()  # e.g. rendering scripts on a laptop
    code, out = _launch_unknown_partition(corpus, "--dry-run")
    assert code == 0 and "#SBATCH --partition=nope" in out, out
    assert not home.exists()
