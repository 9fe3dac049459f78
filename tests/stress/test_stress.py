"""Concurrency and crashes: writers and reconcilers SIGKILLed at random lose
nothing and ingest nothing twice; two reconcilers started together submit once.

Bounded form in CI; ``pytest --long tests/stress`` (or DLHPC_LONG=1) runs the long
form (docs/BENCHMARKS.md, "Concurrency stress", gives the commands).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.stress._race import race_round
from tests.stress._stress import run_stress


def test_killed_writers_and_reconcilers_lose_nothing_and_ingest_nothing_twice(
    tmp_path: Path, long_run: bool, fewer: bool
) -> None:
    """Under ``fewer`` (the other Pythons) 64 writers, not 256: a writer is a process, and
    the concurrency is the same at a quarter of its CPU."""
    if long_run:
        res = run_stress(tmp_path, writers=256, events=120, reconcilers=4, kill_writers=0.5)
    else:
        res = run_stress(tmp_path, writers=64 if fewer else 256, events=20, reconcilers=3)
    print(dataclasses.asdict(res))  # the figures, shown with pytest -s
    assert res.problems == []
    assert res.writers_killed > 0 and res.reconcilers_killed > res.reconcilers  # kills mid-run
    assert res.files_by_reconcilers > 0  # the reconcilers ingested while writers wrote
    assert res.files_published > res.writers and res.checkpoints > 0


def test_two_reconcilers_started_together_submit_once(
    tmp_path: Path, long_run: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    n = 20 if long_run else 3
    # the last round runs one of them with -q: then it prints nothing at all
    rounds = [race_round(tmp_path / f"r{i}", 3, (i == n - 1, False), monkeypatch) for i in range(n)]
    # on a loaded machine one may end before the other starts: more rounds (at most 10
    # in all), until they met at the lease once
    while not any(r.lease_held for r in rounds) and len(rounds) < max(n, 10):
        rounds.append(race_round(tmp_path / f"r{len(rounds)}", 3, (False, False), monkeypatch))
    for r in rounds:
        for code, out, err in r.outputs:
            assert code == 0 and err == "", (out, err)  # no traceback, no warning
            assert len(out.splitlines()) <= 1, out  # a note, or the winner's tick line
        assert r.submissions == 1 and r.local_batches == 1, r.outputs  # one did the work
        assert r.attempts_per_trial == [1] * 3 and sum(r.submitted_counts) in (0, 3)
    held = sum(r.lease_held for r in rounds)
    print(f"{len(rounds)} rounds; the loser found the lease held (and said so) in {held}")
    assert held >= 1  # they really ran at the same time
