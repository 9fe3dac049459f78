"""``dlhpc cron --scrontab``: ``#SCRON`` option lines (the site's partition, account and
QOS, a time limit, the log) then the same crontab line as ``dlhpc cron``, which run as
cron runs it ticks an experiment (tests/unit/test_cron.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlhpc.cli._cron import cron_line, scrontab_entry
from tests.unit._cli import run


def _site(tmp_path: Path, extra: str = "") -> Path:
    site = tmp_path / "site.yaml"
    site.write_text(
        "name: s\nbackend: local\npartition: gpu,cpu\naccount: lab\nqos: normal\n" + extra,
        encoding="utf-8",
    )
    return site


def test_entry_is_scron_options_then_the_cron_line(tmp_path: Path, home: Path) -> None:
    site = str(_site(tmp_path))
    entry, env = scrontab_entry(site, every=2, time_limit="00:05:00")
    *options, line = entry.splitlines()
    assert options == [
        "#SCRON --job-name=dlhpc-tick",
        "#SCRON --partition=gpu",
        "#SCRON --account=lab",
        "#SCRON --qos=normal",
        "#SCRON --time=00:05:00",
        "#SCRON --cpus-per-task=1",
        f"#SCRON --output={home}/cron/scrontab.log",
        "#SCRON --open-mode=append",
    ]
    assert line == cron_line(site, every=2)[0]
    assert line.startswith("*/2 * * * * export PATH=") and " tick -q && " in line
    assert env["DLHPC_HOME"] == str(home)


def test_site_without_partition_or_account(tmp_path: Path, home: Path) -> None:
    site = tmp_path / "bare.yaml"
    site.write_text("name: b\nbackend: local\n", encoding="utf-8")
    entry, _ = scrontab_entry(str(site))
    assert not any(x in entry for x in ("--partition", "--account", "--qos"))


def test_cli_prints_the_entry_and_makes_the_log_folder(tmp_path: Path, home: Path) -> None:
    res = run("cron", "--site", str(_site(tmp_path)), "--scrontab", "--every", "5")
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0].startswith("# dlhpc: tick every 5 min")
    assert "#SCRON --time=00:10:00" in lines
    assert lines[-1].startswith("*/5 * * * * export ")
    assert (home / "cron").is_dir()


def test_option_with_space_is_refused(tmp_path: Path, home: Path) -> None:
    with pytest.raises(Exception, match="holds a space"):
        scrontab_entry(str(_site(tmp_path)), time_limit="00:05 :00")
