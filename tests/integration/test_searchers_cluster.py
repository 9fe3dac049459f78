"""Every searcher end to end on the real dev Slurm cluster: sha, hyperband, asha with the
TPE proposer, and bayes, each through ``dlhpc launch`` and ``dlhpc tick``.

The four tiny digits experiments are launched at once into one DLHPC_HOME and ticked
together (one wait instead of four, each chain of jobs at most 3 long): CI's time
budget. Then, per searcher:

* the rung searchers (``sha``, ``hyperband``, ``asha`` + ``tpe``): weak array tasks end at
  their rung and are stopped early, a paused trial is promoted and resumes from its
  checkpoint in a new array task (``resumed at epoch`` in that job's log), and a trial
  trained to ``max_length`` completes; ``hyperband`` runs both of its brackets;
* ``asha`` + ``tpe``: the trials created before any results are random search's, those
  created after two results are the model's (not random search's);
* ``bayes``: one trial at a time, so its decisions replay exactly: the searcher rebuilt
  from the experiment's config and told the results the cluster produced proposes the
  same three trials, and its last trial changes when told other results (the Gaussian
  process chose it, not the random sampler).

``random`` to completion is test_e2e_cluster.py's; plain ``asha`` test_search_cluster.py's.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from dlhpc.config import ExperimentConfig
from dlhpc.config.serde import from_jsonable
from dlhpc.search import BaseSearcher, Create, RandomSearcher, make_searcher
from tests.integration.conftest import POLL_S, REPO, Cli

pytestmark = pytest.mark.cluster

DIGITS = REPO / "templates" / "examples" / "digits"
RUNG = "metric: val_accuracy, smaller_is_better: false, max_length: 3, divisor: 3, max_rungs: 2"
SEARCHERS = {  # rungs of 1 and 3 epochs; the longest chains of jobs are launched first
    # 1 initial (random) point of 3, then the GP; one trial at a time
    "bayes": "{name: bayes, metric: val_accuracy, smaller_is_better: false, max_trials: 3,"
    " max_length: 2, max_concurrent_trials: 1, seed: 8}",
    # the model proposes once two trials have a result (no random fraction; fidelity: all,
    # since the default's model needs twice min_points results at one rung)
    "tpe": f"{{name: asha, {RUNG}, max_trials: 4, max_concurrent_trials: 2, seed: 7,"
    " proposer: {name: tpe, min_points: 2, random_fraction: 0.0, fidelity: all}}",
    # brackets: 3 trials at 1 epoch (one promoted to 3), 2 trials straight to 3 epochs
    "hyperband": f"{{name: hyperband, {RUNG}, mode: conservative, max_trials: 5,"
    " max_concurrent_trials: 3, seed: 6}",
    "sha": f"{{name: sha, {RUNG}, max_trials: 3, seed: 5}}",
}


def _experiment(tmp_path: Path, key: str, searcher: str) -> Path:
    """The digits ASHA example with ``searcher`` and the name ``e2e-<key>``, in its own folder."""
    d = tmp_path / key
    d.mkdir()
    shutil.copy(DIGITS / "train.py", d / "train.py")
    text = (DIGITS / "asha.yaml").read_text()
    head = text[: text.index("searcher:")].replace("name: digits-asha", f"name: e2e-{key}")
    (d / "exp.yaml").write_text(head + f"searcher: {searcher}\n")
    return d / "exp.yaml"


def _tick_all(cli: Cli, ids: list[int], timeout: float) -> dict[int, dict[str, Any]]:
    """Tick until no experiment of ``ids`` is ACTIVE; each one's status (with its trials)."""
    deadline = time.monotonic() + timeout
    while True:
        cli("tick", "-q")
        states = {e["id"]: e["state"] for e in cli.json("status")["experiments"]}
        if all(states[i] != "ACTIVE" for i in ids):
            return {i: cli.experiment(i) for i in ids}
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out; states {states}")
        time.sleep(POLL_S)


@dataclasses.dataclass(frozen=True)
class _Trial:
    """One trial as the database has it, with its attempts' causes and logs in order."""

    request_id: int
    state: str
    hparams: dict[str, Any]
    grant: int
    steps: int
    best: float | None
    causes: tuple[str, ...]
    logs: tuple[str, ...]


def _trials(con: sqlite3.Connection, exp_id: int) -> list[_Trial]:
    out = []
    rows = con.execute(
        "SELECT id, request_id, state, hparams_json, max_length, steps_completed, best_metric"
        " FROM trials WHERE experiment_id = ? ORDER BY request_id",
        (exp_id,),
    ).fetchall()
    for tid, rid, state, hp, grant, steps, best in rows:
        attempts = con.execute(
            "SELECT cause, log_path FROM attempts WHERE trial_id = ? ORDER BY id", (tid,)
        ).fetchall()
        causes = tuple(c for c, _ in attempts)
        logs = tuple(str(p) for _, p in attempts)
        out.append(_Trial(rid, state, json.loads(hp), grant, steps, best, causes, logs))
    return out


def _config(con: sqlite3.Connection, exp_id: int) -> tuple[ExperimentConfig, dict[str, Any]]:
    """The experiment's resolved config and its searcher's saved state."""
    cfg_json, state = con.execute(
        "SELECT config_json, searcher_state FROM experiments WHERE id = ?", (exp_id,)
    ).fetchone()
    return from_jsonable(ExperimentConfig, json.loads(cfg_json)), json.loads(state)


def _check_rungs(exp: dict[str, Any], trials: list[_Trial]) -> list[_Trial]:
    """Checks that weak trials were stopped at rung 1 and every completed trial trained all
    3 epochs; returns the promoted trials, each resumed from its checkpoint (at least one)."""
    assert exp["state"] == "COMPLETED", exp
    assert {t.state for t in trials} == {"COMPLETED", "STOPPED_EARLY"}, trials
    for t in trials:
        if t.state == "STOPPED_EARLY":  # its one array task ended at 1 epoch: paused, or
            # stopped when the decision came while it was still exiting (sha's, synchronous)
            assert (t.grant, t.steps) == (1, 1) and t.causes in (("paused",), ("stopped",)), t
        else:
            assert (t.grant, t.steps, t.causes[-1]) == (3, 3, "completed"), t
    promoted = [t for t in trials if t.causes == ("paused", "completed")]
    assert promoted, trials
    for t in promoted:  # a new array task, which loaded the rung's checkpoint
        assert "resumed at epoch 1" in Path(t.logs[1]).read_text(), t
    return promoted


def _replay_bayes(cfg: ExperimentConfig, results: list[float]) -> list[dict[str, Any]]:
    """The hyperparameters bayes proposes one trial at a time, trial i scoring results[i]."""
    searcher: BaseSearcher = make_searcher(cfg.hyperparameters, cfg.searcher)
    proposed = []
    for rid, value in enumerate(results):
        (op,) = searcher.ask(1)
        assert isinstance(op, Create) and op.request_id == rid
        proposed.append(op.hparams)
        searcher.tell(rid, cfg.searcher.max_length, value)
        searcher.tell_exited(rid)
    return proposed


@dataclasses.dataclass(frozen=True)
class _Run:
    """One finished experiment: its status, trials, config, searcher state and promotions."""

    status: dict[str, Any]
    trials: list[_Trial]
    config: ExperimentConfig
    state: dict[str, Any]
    promotes: int


def _runs(cli: Cli, ids: dict[str, int], statuses: dict[int, dict[str, Any]]) -> dict[str, _Run]:
    con = sqlite3.connect(cli.home / "dlhpc.db")
    try:
        promotes = dict(
            con.execute(
                "SELECT experiment_id, COUNT(*) FROM decisions WHERE kind = 'promote'"
                " GROUP BY experiment_id"
            ).fetchall()
        )
        return {
            key: _Run(statuses[i], _trials(con, i), *_config(con, i), promotes.get(i, 0))
            for key, i in ids.items()
        }
    finally:
        con.close()


def _check_sha(run: _Run) -> None:
    """3 trials at 1 epoch; once all reported, the best one promoted, the other two stopped."""
    (best,) = _check_rungs(run.status, run.trials)
    assert run.promotes == 1 and len(run.trials) == 3
    # synchronous: the completed trial was the best at rung 1, so it is the best overall
    results = [t.best for t in run.trials]
    assert None not in results and best.best == max(r for r in results if r is not None)


def _check_hyperband(run: _Run) -> None:
    """Bracket s=1: 3 trials at 1 epoch, one promoted; bracket s=0: 2 trials straight to 3."""
    assert len(_check_rungs(run.status, run.trials)) == 1
    assert run.promotes == 1 and len(run.trials) == 5
    straight = [t for t in run.trials if t.causes == ("completed",)]
    assert len(straight) == 2 and all(t.grant == 3 for t in straight), run.trials
    assert sum(t.causes[0] == "paused" for t in run.trials) == 3, run.trials


def _check_tpe(run: _Run) -> None:
    """Rungs as asha's (asynchronous: a later trial that tops rung 1 is promoted too).
    Trials 0 and 1 were created at launch, before any result: random search's; trial 3
    only after two trials had paused at rung 1: the model's, not random search's."""
    assert len(_check_rungs(run.status, run.trials)) == run.promotes >= 1
    assert len(run.trials) == 4
    cfg = run.config
    randoms = RandomSearcher(cfg.hyperparameters, cfg.searcher).ask(4)
    random_hp = [op.hparams for op in randoms if isinstance(op, Create)]
    assert [t.hparams for t in run.trials[:2]] == random_hp[:2]
    later = zip(run.trials[3:], random_hp[3:], strict=True)
    assert all(t.hparams != r for t, r in later), run.trials


def _check_bayes(run: _Run) -> None:
    """3 trials to 2 epochs (no early stopping), one at a time: the replay told the
    cluster's results proposes exactly the cluster's trials; trial 0 is the initial
    (random) point, and trial 2, proposed from two results, changes when they are swapped:
    the GP chose it, not the random sampler. (Trial 1, the GP's from a single result,
    does not depend on its value.)"""
    assert run.status["state"] == "COMPLETED", run.status
    got = [(t.state, t.steps, t.causes) for t in run.trials]
    assert got == [("COMPLETED", 2, ("completed",))] * 3
    assert run.state["n_initial_points"] == 1
    results = dict(run.state["results"])  # what the searcher was told: each final val_accuracy
    told = [results[i] for i in range(3)]
    assert _replay_bayes(run.config, told) == [t.hparams for t in run.trials]
    low_high = _replay_bayes(run.config, [0.1, 0.9, *told[2:]])
    high_low = _replay_bayes(run.config, [0.9, 0.1, *told[2:]])
    assert low_high[0] == high_low[0] == run.trials[0].hparams
    assert low_high[2] != high_low[2]


def test_sha_hyperband_tpe_and_bayes_run_end_to_end(cli: Cli, tmp_path: Path) -> None:
    ids = {
        key: cli.json("launch", str(_experiment(tmp_path, key, s)))["experiment_id"]
        for key, s in SEARCHERS.items()
    }
    runs = _runs(cli, ids, _tick_all(cli, list(ids.values()), timeout=600))
    _check_sha(runs["sha"])
    _check_hyperband(runs["hyperband"])
    _check_tpe(runs["tpe"])
    _check_bayes(runs["bayes"])
