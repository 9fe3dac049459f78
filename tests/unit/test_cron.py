"""``dlhpc cron``: the printed line survives cron and /bin/sh, and run as cron runs it
(``env -i`` with cron's environment, cron's ``%`` rule, ``/bin/sh -c`` in $HOME) it ticks a
local-backend experiment to the end, writes the report pages, prints nothing while all is
well and prints the failure when a trial fails; ``--notify`` appends a digest."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from dlhpc.cli import _cron
from dlhpc.cli.main import cli
from tests.unit._cli import local_exp_dir, run, status, until_over

CRON_PATH = "/usr/bin:/bin"  # what cron gives a job


def cron_command(line: str) -> tuple[str, str]:
    """What cron (Debian's vixie cron, do_command.c) runs for a crontab line: the command
    up to the first unescaped ``%`` (with ``\\%`` made ``%``), and the stdin after it."""
    fields = line.split(None, 5)
    assert len(fields) == 6 and not line.startswith("#"), line
    cmd, out, escaped = fields[5], [], False
    for i, ch in enumerate(cmd):
        if escaped:
            if ch == "%":
                out.pop()  # the backslash
            out.append(ch)
            escaped = False
            continue
        if ch == "\\":
            escaped = True
        elif ch == "%":
            return "".join(out), cmd[i + 1 :].replace("%", "\n")
        out.append(ch)
    return "".join(out), ""


def run_as_cron(line: str, home: Path) -> subprocess.CompletedProcess[str]:
    """Run ``line``'s command as cron would: empty environment but cron's few variables,
    /bin/sh -c, in $HOME, the part after a bare ``%`` on stdin."""
    command, stdin = cron_command(line)
    env = {"HOME": str(home), "LOGNAME": "root", "SHELL": "/bin/sh", "PATH": CRON_PATH}
    return subprocess.run(
        ["/bin/sh", "-c", command],
        cwd=home,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _the_line(output: str) -> str:
    lines = [x for x in output.splitlines() if x.strip() and not x.startswith("#")]
    assert len(lines) == 1, output
    return lines[0]


ODD = 'it\'s 100% \\%odd\\ "quoted" $HOME `x` ;&|'


def test_printed_line_survives_cron_and_sh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake python (at a path with quotes, spaces, % and shell characters) records its
    argv and environment: each of the three commands gets exactly what was meant."""
    odd_dir = tmp_path / f"bin {ODD}"
    odd_dir.mkdir()
    record = tmp_path / "calls.jsonl"
    fake = odd_dir / "python"
    fake.write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        f"with open({str(record)!r}, 'a') as f:\n"
        "    f.write(json.dumps({'argv': sys.argv[1:], 'env': dict(os.environ)}) + '\\n')\n"
    )
    fake.chmod(0o755)
    home = tmp_path / f"home {ODD}"
    site = tmp_path / 'site it\'s 100% "odd".yaml'  # site paths expand $VAR and ~
    site.write_text("name: oddsite\nbackend: local\n")
    monkeypatch.setattr(sys, "executable", str(fake))
    monkeypatch.setenv("DLHPC_HOME", str(home))
    monkeypatch.setenv("SLURM_CONF", f"/etc/slurm {ODD}/slurm.conf")
    monkeypatch.setenv("PATH", f"/opt/x {ODD}/bin:relative/bin:/usr/bin:/bin")
    out_dir, digest = tmp_path / f"out {ODD}", tmp_path / f"digest {ODD}.txt"
    res = run(
        "cron", "--site", str(site), "--every", "5", "--out-dir", str(out_dir),
        "--notify", str(digest),
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    line = _the_line(res.output)
    assert line.startswith("*/5 * * * * ")
    proc = run_as_cron(line, tmp_path)
    assert proc.returncode == 0 and proc.stdout == proc.stderr == "", proc
    calls = [json.loads(x) for x in record.read_text().splitlines()]
    assert [c["argv"] for c in calls] == [
        ["-m", "dlhpc", "tick", "-q"],
        ["-m", "dlhpc", "report", "--all", "--out-dir", str(out_dir), "-q"],
        ["-m", "dlhpc", "digest", "--notify", str(digest)],
    ]
    env = calls[0]["env"]
    assert env["DLHPC_HOME"] == str(home)
    assert env["DLHPC_SITE"] == str(site)
    assert env["SLURM_CONF"] == f"/etc/slurm {ODD}/slurm.conf"
    assert env["PATH"] == f"{odd_dir}:/opt/x {ODD}/bin:/usr/bin:/bin"  # venv first, no relative


@pytest.mark.parametrize("value", ["%", "a\\%b", "\\", "x%%y\\", "'%'", ""])
def test_cron_quote_round_trips(value: str) -> None:
    command, stdin = cron_command(f"* * * * * printf \\%s {_cron._cron_quote(value, 'v')}")
    assert stdin == ""
    out = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, check=True)
    assert out.stdout == value


def test_cron_refuses_what_cron_cannot_hold(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    monkeypatch.setenv("DLHPC_SITE", "local")
    assert CliRunner().invoke(cli, ["cron", "--every", "61"]).exit_code == 2
    res = CliRunner().invoke(cli, ["cron", "--out-dir", "/tmp/a\nb"])
    assert res.exit_code == 2 and "newline" in res.output
    monkeypatch.setenv("PATH", "/nonexistent")  # no `mail` here
    res = CliRunner().invoke(cli, ["cron", "--notify", "mail:me@example.org"])
    assert res.exit_code == 2 and "no `mail` command" in res.output


# ----------------------------------------------------------------------- end to end


@pytest.fixture
def exp_dir(tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return local_exp_dir(tmp_path, monkeypatch)


def _launch(exp_dir: Path, name: str, hparams: str) -> int:
    (exp_dir / f"{name}.yaml").write_text(
        f"name: {name}\nentrypoint: python train.py\nmax_restarts: 0\n"
        f"hyperparameters:\n  {hparams}\n"
        "searcher: {name: grid, metric: loss, max_length: 2, max_concurrent_trials: 2}\n"
    )
    res = run("launch", str(exp_dir / f"{name}.yaml"), "--json")
    assert res.exit_code == 0, res.output
    return int(json.loads(res.output)["experiment_id"])


def _cron_until_over(line: str, exp_id: int, cwd: Path, timeout: float = 180) -> list[str]:
    """Run the line as cron would until the experiment ends; each run's output."""
    outputs: list[str] = []

    def once() -> None:
        proc = run_as_cron(line, cwd)
        assert proc.returncode == 0, proc
        outputs.append(proc.stdout + proc.stderr)

    until_over(exp_id, once, timeout)
    return outputs


def test_cron_line_ticks_reports_and_digests(exp_dir: Path, home: Path, tmp_path: Path) -> None:
    ok_id = _launch(exp_dir, "cron-ok", "x: {type: double, minval: 0.1, maxval: 0.5, count: 2}")
    out_dir, digest = tmp_path / "reports", tmp_path / "digest.txt"
    res = run("cron", "--out-dir", str(out_dir), "--notify", str(digest))
    assert res.exit_code == 0, res.output
    line = _the_line(res.output)
    cron_home = tmp_path / "cron-home"  # cron's cwd and $HOME: nothing of ours there
    cron_home.mkdir()

    assert status(ok_id)["state"] == "ACTIVE"  # only a tick can end it: the line's
    outputs = _cron_until_over(line, ok_id, cron_home)
    assert outputs == [""] * len(outputs), outputs  # all well: not a word (no cron mail)
    exp = status(ok_id)
    assert exp["state"] == "COMPLETED"
    assert all(t["steps_completed"] == 2 for t in exp["trials"])
    pages = {p.name for p in out_dir.rglob("*.html")}
    assert "index.html" in pages and len(pages) >= 2, pages  # the index and the experiment
    index = (out_dir / "index.html").read_text()
    assert "cron-ok" in index
    text = digest.read_text()
    assert f"finished: experiment {ok_id} cron-ok COMPLETED: 2 trials (0 failed)" in text
    assert "best loss=0.05 (trial" in text and "CPU-h" in text

    fail_id = _launch(exp_dir, "cron-fail", "x: 1.0")
    outputs = _cron_until_over(line, fail_id, cron_home)
    said = "".join(outputs)
    assert f"of experiment {fail_id} (cron-fail) failed: " in said and "exit code 3" in said
    assert f"experiment {fail_id} (cron-fail) ended FAILED" in said
    assert said.count("exit code 3") == 1, said  # said once, not on every later pass
    assert run_as_cron(line, cron_home).stdout == ""  # and then quiet again
    text = digest.read_text()
    assert f"finished: experiment {fail_id} cron-fail FAILED: 1 trials (1 failed)" in text
    assert f"failed: trial {exp['trials'][-1]['id'] + 1} of experiment {fail_id}" in text
    assert text.count(f"experiment {ok_id} cron-ok") == 1  # each digest: only what is new


def test_overlapping_tick_exits_quietly(exp_dir: Path, home: Path) -> None:
    """What keeps two cron runs apart: a tick that finds the lease taken says nothing."""
    from dlhpc.cli._common import open_store

    _launch(exp_dir, "cron-lease", "x: 0.1")
    store = open_store()
    with store.hold_lease():
        env = {**os.environ, "PATH": CRON_PATH}
        proc = subprocess.run(
            [sys.executable, "-m", "dlhpc", "tick", "-q"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert proc.returncode == 0 and proc.stdout == proc.stderr == "", proc
