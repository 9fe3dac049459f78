"""scripts/bench/_result.py: the JSON file a benchmark writes with ``--json PATH``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "scripts" / "bench"
sys.path.insert(0, str(BENCH))

from _result import write_result  # noqa: E402


def test_the_result_is_written_with_its_date_command_and_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = BENCH / "report" / "bench_report.py"
    monkeypatch.setattr(sys, "argv", [str(script), "--trials", "10", "--json", "out.json"])
    out = tmp_path / "sub" / "out.json"
    write_result(out, {"page_bytes": 123, "runs": [1.5, 2.5]})
    record = json.loads(out.read_text())
    assert record["result"] == {"page_bytes": 123, "runs": [1.5, 2.5]}
    assert record["command"] == (
        "python scripts/bench/report/bench_report.py --trials 10 --json out.json"
    )
    assert record["date_utc"].endswith("Z") and record["date_utc"][:2] == "20"
    machine = record["machine"]
    assert machine["cpus"] >= 1 and machine["python"].count(".") == 2
    assert len(machine["loadavg_1_5_15_min_at_end"]) == 3


def test_a_script_outside_the_repository_keeps_its_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "argv", [str(tmp_path / "x.py"), "a b"])
    write_result(tmp_path / "r.json", {})
    assert json.loads((tmp_path / "r.json").read_text())["command"] == (
        f"python {tmp_path / 'x.py'} 'a b'"
    )


def _summary_rows() -> list[tuple[str, list[str]]]:
    """(code cell, JSON paths) of each row of docs/BENCHMARKS.md's summary that names a JSON."""
    text = (BENCH.parents[1] / "docs" / "BENCHMARKS.md").read_text()
    table = text[text.index("## Summary") :].split("\n## ", 1)[0]
    rows = []
    for line in table.splitlines()[4:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 4 and cells[3]:
            rows.append((cells[1], [p.strip(" `") for p in cells[3].split(",")]))
    return rows


def test_every_json_of_the_benchmarks_summary_exists_and_names_its_command() -> None:
    rows = _summary_rows()
    assert len(rows) >= 10
    for code, paths in rows:
        script = code.split("`")[1].split()[0]
        for path in paths:
            full = BENCH.parents[1] / path if path.startswith("scripts/") else BENCH / path
            found = sorted(full.parent.glob(full.name))
            assert found, f"{path} (row {code}) does not exist"
            for f in found:
                record = json.loads(f.read_text())
                if isinstance(record, dict) and "command" in record:
                    command = record["command"]  # a string, or an argv list
                    text = command if isinstance(command, str) else " ".join(command)
                    assert script in text, (f, command)
