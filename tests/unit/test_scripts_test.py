"""scripts/test's matrix logic, without a cluster: its dry mode (DLHPC_TEST_DRY=1), and a
run in a copy of the script beside stand-ins for scripts/dev-cluster and the venv's
python that print pytest summaries, to check the counts, the failing parts and the
closing summary line that CI reads.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "test"
MATRIX = [
    "24.11-default",
    "26.05-default",
    "22.05-strict",
    "22.05-adapters",
    "22.05-noacct",
    "24.11-strict",
    "24.11-noacct",
    "26.05-strict",
    "26.05-noacct",
]
UNSET = "+ env -u SLURM_CONF -u DLHPC_DEV_SLURM -u DLHPC_DEV_PROFILE -u DLHPC_DEV_CHROOT"
ADAPTERS = "22.05-adapters"  # a second 22.05 default cluster, of its own folder and ports
SECOND = "DLHPC_DEV_CLUSTER_DIR=/var/tmp/dlhpc-dev-cluster-22.05-adapters"
SUMMARY = re.compile(r"^(\d+) passed, (\d+) failed, (\d+) skipped in [0-9.]+s$")

DEV_CLUSTER = """\
#!/bin/sh
echo "dev-cluster $*" >> "$CALLS"
part="$3-$5"
case $1 in
up) [ "$part" != "$FAIL_UP" ] ;;
exec)
    while [ "$1" != "--" ]; do shift; done
    shift
    DLHPC_DEV_SLURM=${part%-*} DLHPC_DEV_PROFILE=${part#*-} exec "$@" ;;
*) exit 0 ;;
esac
"""

# The whole suite's cluster part waits (up to 10 s) for its unit part to start, and says so:
# the two run side by side.
PYTHON = """\
#!/bin/sh
case "$*" in *"import dlhpc"*) exit 0 ;; esac
echo "python $DLHPC_DEV_SLURM-$DLHPC_DEV_PROFILE $DLHPC_REQUIRE_CLUSTER $*" >> "$CALLS"
case "$*" in
*"-m not cluster"*) touch "$CALLS.unit" ;;
*"-m cluster"*)
    i=0
    while [ ! -e "$CALLS.unit" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
    [ -e "$CALLS.unit" ] && echo "beside the unit part" >> "$CALLS" ;;
esac
fail=0
[ "$DLHPC_DEV_SLURM-$DLHPC_DEV_PROFILE" = "$FAIL_PYTEST" ] && fail=1
if [ -n "$FAIL_MARK" ]; then case "$*" in *"-m $FAIL_MARK "*) fail=1 ;; esac; fi
if [ $fail = 1 ]; then
    printf '\\033[31m1 failed, 4 passed, 1 error in 2.50s\\033[0m\\n'
    exit 1
fi
echo "6 passed, 1 skipped, 30 deselected in 83.10s (0:01:23)"
"""

LINTER = """\
#!/bin/sh
echo "lint ${0##*/}" >> "$CALLS"
[ "${0##*/}" != "$FAIL_LINT" ]
"""

# scripts/test-pythons: its last line in pytest's summary format
PYTHONS = """\
#!/bin/sh
[ "$1" = --list ] && { echo 3.10; echo 3.12; exit 0; }
echo "test-pythons $*" >> "$CALLS"
echo "12 passed, 0 failed, 2 skipped in 1.00s"
"""


def _script(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith("DLHPC_")}
    return subprocess.run(
        ["bash", str(cwd / "scripts" / "test"), *args],
        env={**keep, **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _dry(matrix: str | None = None, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"DLHPC_TEST_DRY": "1", **({"DLHPC_TEST_MATRIX": matrix} if matrix else {})}
    return _script(env, REPO, *args)


def test_dry_run_of_the_whole_matrix_lists_every_part_in_order() -> None:
    proc = _dry(None, "-x")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "+ scripts/setup-venv"
    assert lines[1] == "+ .venv/bin/python -m pip install -q --upgrade submitit"  # the newest
    assert lines.index("+ scripts/setup-browser") < lines.index("+ scripts/dev-cluster up")
    # the whole suite in two parts, which select complementary sets and list their slowest
    whole = "+ python -m pytest -q -p no:cacheprovider --durations=25"
    clustered = next(ln for ln in lines if ln.startswith(f"{whole} -m cluster "))
    unit = f"{whole} -m not\\ cluster -x"
    # the adapters' tests are left to their own part, on a second 22.05 default cluster
    adapters = [ln for ln in lines if SECOND in ln and "-m pytest" in ln]
    assert len(adapters) == 1 and " -m cluster tests/integration/test_adapter_" in adapters[0]
    files = adapters[0].split(" -m cluster ")[1].split()
    assert files and all((REPO / f).is_file() for f in files), files
    assert clustered == f"{whole} -m cluster " + " ".join(f"--ignore={f}" for f in files) + " -x"
    # the unit tests on the other Pythons, one part each, after the unit part here (dry)
    pythons = [ln for ln in lines if ln.startswith("+ scripts/test-pythons ")]
    assert len(pythons) >= 1 and min(map(lines.index, pythons)) > lines.index(unit), lines
    assert lines.index("+ scripts/dev-cluster up") < lines.index(clustered), lines
    assert lines.index("+ mypy") < lines.index(unit), lines
    # dry: the whole suite's cluster goes down before the matrix's first part comes up
    suite = max(lines.index(clustered), lines.index(unit))
    down = lines.index("+ scripts/dev-cluster down")
    assert suite < down < min(i for i, ln in enumerate(lines) if "dev-cluster up --slurm" in ln)
    ups = [ln for ln in lines if " scripts/dev-cluster up --slurm" in ln]
    expected = ["22.05-default" if p == ADAPTERS else p for p in MATRIX]
    assert [re.sub(r".*--slurm (\S+) --profile (\S+)$", r"\1-\2", ln) for ln in ups] == expected
    for part in MATRIX:
        if part == ADAPTERS:
            continue
        v, p = part.split("-")
        flags = f"--slurm {v} --profile {p}"
        runs = [ln for ln in lines if f"exec {flags}" in ln and "-m pytest" in ln]
        # the smoke set on the newest version (default) and as the unprivileged user
        # (22.05 strict); every other part runs the profile's own tests and every_part
        full = (v, p) in {("22.05", "strict"), ("26.05", "default")}
        selection = "smoke\\ or\\ profile" if full else "profile\\ or\\ every_part"
        assert len(runs) == 1 and f" -m {selection} tests/integration" in runs[0], runs
        assert " --durations=10 " in runs[0]
        assert ("--user dlhpc-user --" in runs[0]) == (p == "strict")
        assert "DLHPC_REQUIRE_CLUSTER=1 PYTHONDONTWRITEBYTECODE=1" in runs[0]
        assert f"{UNSET} scripts/dev-cluster down {flags}" in lines
    assert SUMMARY.match(lines[-1]), lines[-1]


def test_one_part_runs_only_that_part() -> None:
    proc = _dry("22.05-default")  # the cluster tests, without linters or browser
    assert proc.returncode == 0 and "--slurm" not in proc.stdout and "+ mypy" not in proc.stdout
    assert "+ scripts/dev-cluster up" in proc.stdout and "setup-browser" not in proc.stdout
    assert [ln for ln in proc.stdout.splitlines() if "-m pytest" in ln][0].endswith(" -m cluster")
    proc = _dry("22.05-unit")  # the linters and the other tests, with no cluster
    assert proc.returncode == 0 and "dev-cluster" not in proc.stdout and "+ mypy" in proc.stdout
    assert "+ scripts/setup-browser" in proc.stdout and "-m not\\ cluster" in proc.stdout
    proc = _dry("22.05-noacct")
    assert proc.returncode == 0 and "setup-browser" not in proc.stdout
    assert "+ mypy" not in proc.stdout and proc.stdout.count("--profile noacct") == 4


def test_a_profile_on_the_middle_version_runs_its_own_tests_as_its_user() -> None:
    proc = _dry("24.11-strict")
    assert proc.returncode == 0 and "setup-browser" not in proc.stdout
    runs = [ln for ln in proc.stdout.splitlines() if "-m pytest" in ln]
    assert len(runs) == 1 and "--user dlhpc-user --" in runs[0], runs
    assert " -m profile\\ or\\ every_part tests/integration" in runs[0], runs


def test_quick_runs_the_unit_tests_and_the_smoke_set_on_the_22_05_cluster_only() -> None:
    lines = _dry(None, "--quick", "-x").stdout.splitlines()
    assert lines[-1].startswith("0 passed, 0 failed, 0 skipped in "), lines
    runs = [ln for ln in lines if "-m pytest" in ln]
    head = "+ .venv/bin/python -m pytest -q -p no:cacheprovider --durations=10"
    assert len(runs) == 2 and all(r.startswith(head) and r.endswith(" -x") for r in runs), runs
    smoke, unit = (shlex.split(r.removeprefix(head)) for r in runs)
    assert smoke[:2] == ["-m", "smoke"] and smoke[-2:] == ["tests/integration", "-x"], smoke
    assert unit[:2] == ["-m", "not cluster"], unit
    # what --quick leaves out is named, and the whole suite (no --ignore) runs it
    assert smoke[2:-2] == ["--ignore=tests/integration/test_deepspeed_cluster.py"], smoke
    # each names a file or folder that exists, or a test that exists by its node id (a
    # --deselect of a renamed test would leave nothing, silently)
    assert unit[2:-1], unit
    for arg in unit[2:-1]:
        flag, left = arg.split("=", 1)
        path, _, name = left.partition("::")
        assert flag == ("--deselect" if name else "--ignore"), arg
        assert (REPO / path).exists(), arg
        assert not name or f"def {name}(" in (REPO / path).read_text(), arg
    parts = [ln.split(": ")[0:2] for ln in lines if ln.startswith("== part ")]
    assert parts == [["== part quick-smoke", "ok"], ["== part quick-unit", "ok"]], lines
    assert "+ scripts/dev-cluster up" in lines and not any("down" in ln for ln in lines)
    assert not any(w in ln for ln in lines for w in ("--slurm", "mypy", "setup-browser", "pip"))


def test_quick_adds_up_its_two_parts_and_a_failing_smoke_part_fails_the_run(
    stand_in: tuple[Path, dict[str, str]],
) -> None:
    root, env = stand_in
    proc = _script({**env, "FAIL_MARK": "smoke"}, root, "--quick", "-x")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert SUMMARY.match(lines[-1]) and lines[-1].startswith("10 passed, 2 failed, 1 skipped")
    assert "failed parts: quick-smoke" in lines
    assert sum(ln.startswith("== part quick-smoke: ") for ln in lines) == 1, lines
    assert any(ln.startswith("quick-unit     ok: 6 passed, 0 failed, 1 skipped") for ln in lines)
    assert any(ln.startswith("quick-smoke    FAILED (exit 1): 4 passed, 2 failed") for ln in lines)
    calls = (root / "calls").read_text().splitlines()
    assert "dev-cluster up" in calls and not any("down" in c for c in calls)
    assert sorted(c.split(" -m ")[2].split()[0] for c in calls if " -m pytest " in c) == [
        "not",
        "smoke",
    ]


def test_an_unknown_part_exits_2_naming_the_parts() -> None:
    proc = _dry("23.02-default")
    assert proc.returncode == 2 and "22.05-strict" in proc.stderr and "+ " not in proc.stdout


@pytest.fixture
def stand_in(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A checkout whose scripts/dev-cluster and .venv/bin/python are stand-ins."""
    (tmp_path / "scripts").mkdir()
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    shutil.copy(SCRIPT, tmp_path / "scripts" / "test")
    (tmp_path / ".venv" / "bin" / "activate").write_text('PATH="$PWD/.venv/bin:$PATH"\n')
    for path, text in (
        ("scripts/dev-cluster", DEV_CLUSTER),
        ("scripts/setup-venv", "#!/bin/sh\n"),
        ("scripts/setup-browser", "#!/bin/sh\n"),
        ("scripts/test-pythons", PYTHONS),
        (".venv/bin/python", PYTHON),
        (".venv/bin/ruff", LINTER),
        (".venv/bin/mypy", LINTER),
        (".venv/bin/lint-imports", LINTER),
    ):
        (tmp_path / path).write_text(text)
        (tmp_path / path).chmod(0o755)
    return tmp_path, {"CALLS": str(tmp_path / "calls"), "TMPDIR": str(tmp_path)}


def test_counts_add_up_and_a_failing_part_fails_the_run(
    stand_in: tuple[Path, dict[str, str]],
) -> None:
    root, env = stand_in
    matrix = "24.11-default,22.05-strict,22.05-noacct"
    proc = _script({**env, "DLHPC_TEST_MATRIX": matrix, "FAIL_PYTEST": "22.05-strict"}, root)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert SUMMARY.match(lines[-1]) and lines[-1].startswith("16 passed, 2 failed, 2 skipped")
    assert "failed parts: 22.05-strict" in lines
    assert any(ln.startswith("24.11-default  ok: 6 passed, 0 failed, 1 skipped") for ln in lines)
    assert any(ln.startswith("22.05-strict   FAILED (exit 1): 4 passed, 2 failed") for ln in lines)
    calls = (root / "calls").read_text().splitlines()
    assert "dev-cluster down --slurm 22.05 --profile strict" in calls  # down after a failure
    assert any(c.startswith("python 22.05-noacct 1 -m pytest") for c in calls)


def test_the_whole_suite_runs_its_two_parts_side_by_side_and_a_failing_linter_fails_one(
    stand_in: tuple[Path, dict[str, str]],
) -> None:
    root, env = stand_in
    matrix = "22.05-unit,22.05-default,22.05-noacct"
    proc = _script({**env, "DLHPC_TEST_MATRIX": matrix, "FAIL_LINT": "mypy"}, root, "-x")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    # the unit part's tests ran after the failing linter; the part counts one failure
    assert any(ln.startswith("22.05-unit     FAILED (exit 1): 6 passed, 1 failed") for ln in lines)
    assert any(ln.startswith("22.05-default  ok: 6 passed, 0 failed, 1 skipped") for ln in lines)
    # the unit tests on the other Pythons, one part each, taken once by whichever
    # stream was done first
    for version in ("3.10", "3.12"):
        assert any(
            ln.startswith(f"py-{version}        ok: 12 passed, 0 failed, 2 skipped") for ln in lines
        )
    assert lines[-1].startswith("42 passed, 1 failed, 7 skipped in "), lines
    assert "failed parts: 22.05-unit" in lines
    assert sum(ln.startswith("== part 22.05-default: ") for ln in lines) == 1, lines
    calls = (root / "calls").read_text().splitlines()
    lints = ["lint ruff", "lint mypy", "lint lint-imports"]
    assert [c for c in calls if c.startswith("lint ")] == lints
    pytests = [c for c in calls if c.startswith("python - 1 -m pytest")]
    assert sorted(c.split(" -m ")[2] for c in pytests) == ["cluster -x", "not cluster -x"], calls
    assert "beside the unit part" in calls
    up, down = calls.index("dev-cluster up"), calls.index("dev-cluster down")
    assert up < min(calls.index(c) for c in pytests) and down > max(calls.index(c) for c in pytests)
    assert up < calls.index("dev-cluster up --slurm 22.05 --profile noacct")  # the lane, beside
    assert sorted(c for c in calls if c.startswith("test-pythons")) == [
        "test-pythons 3.10",
        "test-pythons 3.12",
    ]


def test_a_cluster_that_does_not_come_up_is_a_failed_part(
    stand_in: tuple[Path, dict[str, str]],
) -> None:
    root, env = stand_in
    matrix = "26.05-default,22.05-noacct"
    proc = _script({**env, "DLHPC_TEST_MATRIX": matrix, "FAIL_UP": "26.05-default"}, root)
    assert proc.returncode == 1
    assert proc.stdout.splitlines()[-1].startswith("6 passed, 1 failed, 1 skipped in ")
    calls = (root / "calls").read_text()
    assert "python 26.05" not in calls and "python 22.05-noacct" in calls


def test_lanes_keep_a_chroot_version_in_one_lane_and_add_up_as_one_after_another(
    stand_in: tuple[Path, dict[str, str]],
) -> None:
    root, env = stand_in
    matrix = "24.11-default,22.05-strict,22.05-noacct,24.11-strict,26.05-noacct"
    runs = {}
    for lanes in ("0", None):  # None: the default, two lanes
        (root / "calls").unlink(missing_ok=True)
        run_env = {
            **env,
            "DLHPC_TEST_MATRIX": matrix,
            "FAIL_PYTEST": "26.05-noacct",
            "DLHPC_TEST_JSON": str(root / f"parts-{lanes}.json"),
        }
        if lanes is not None:
            run_env["DLHPC_TEST_LANES"] = lanes
        proc = _script(run_env, root)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        runs[lanes] = proc.stdout.splitlines()
    serial, lanes2 = runs["0"], runs[None]
    assert not any(ln.startswith("== lane") for ln in serial)
    # in matrix order, a chroot version's parts share a lane and the host version's (22.05)
    # parts are dealt out one by one: 24.11 -> 0, 22.05-strict -> 1, 22.05-noacct -> 0,
    # 26.05 -> 1
    assert any(
        ln.startswith("== lane 0: 24.11-default 22.05-noacct 24.11-strict ") for ln in lanes2
    ), lanes2
    assert any(ln.startswith("== lane 1: 22.05-strict 26.05-noacct ") for ln in lanes2)

    def table(lines: list[str]) -> list[str]:
        return [ln.split(" in ")[0] for ln in lines if re.match(r"^\d\d\.\d\d-\w+ +(ok|FAI)", ln)]

    assert table(lanes2) == table(serial) and len(table(serial)) == 5
    assert serial[-1].split(" in ")[0] == lanes2[-1].split(" in ")[0]  # the same counts
    assert "failed parts: 26.05-noacct" in lanes2
    # the closing table as JSON: the same parts, counts and totals
    record = json.loads((root / "parts-None.json").read_text())
    assert [p["part"] for p in record["parts"]] == [ln.split()[0] for ln in table(lanes2)]
    failed = [p for p in record["parts"] if p["part"] == "26.05-noacct"]
    assert failed[0]["verdict"].startswith("FAILED") and failed[0]["failed"] == 2
    assert (record["passed"], record["failed"]) == (
        sum(p["passed"] for p in record["parts"]),
        sum(p["failed"] for p in record["parts"]),
    )
    assert record["cores"] >= 1 and 0 <= record["cpu_busy"] <= 1


def test_no_python_to_test_exits_2_before_any_part(stand_in: tuple[Path, dict[str, str]]) -> None:
    root, env = stand_in
    (root / "scripts" / "test-pythons").write_text(
        '#!/bin/sh\necho "test-pythons $*" >> "$CALLS"\n'
    )
    proc = _script({**env, "DLHPC_TEST_MATRIX": "22.05-unit"}, root)
    assert proc.returncode == 2 and "named no Python to test" in proc.stderr, proc.stderr
    assert not any("-m pytest" in c for c in (root / "calls").read_text().splitlines())
