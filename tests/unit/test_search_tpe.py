"""Proposers (random, tpe) for asha and hyperband, and ``max_budget``.

The simulation here is pure: a synthetic objective whose learning curve at length ``L``
is ``f(x) + 0.3 / L``, driven with 4 workers, no clock. The comparison with random is a
statistical check with a fixed seed set and a generous margin, not a timed one.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

import pytest

from dlhpc.config.schema import HParam, SearcherConfig
from dlhpc.config.serde import from_jsonable, to_jsonable
from dlhpc.errors import ConfigError
from dlhpc.search import (
    ASHASearcher,
    BaseSearcher,
    Continue,
    Create,
    SearcherTable,
    SHASearcher,
    Stop,
    make_searcher,
)
from dlhpc.search._budget import sha_cost
from dlhpc.search._tpe import TPE_DEFAULTS, TPEProposer, check_tpe_settings
from tests._config import load_experiment

SPACE = {
    "x": HParam("x", "double", minval=0.0, maxval=1.0),
    "lr": HParam("lr", "log", minval=-6, maxval=0),
    "width": HParam("width", "int", minval=8, maxval=512),
    "act": HParam("act", "categorical", vals=("relu", "tanh", "gelu", "elu")),
    "fixed": HParam("fixed", "const", value=[1, 2]),
}


def loss(h: dict[str, Any], length: int) -> float:
    f = (h["x"] - 0.73) ** 2 + ((math.log10(h["lr"]) + 3.2) / 3) ** 2
    f += ((h["width"] - 300) / 500) ** 2
    f += {"relu": 0.05, "tanh": 0.2, "gelu": 0.0, "elu": 0.1}[h["act"]]
    return f + 0.3 / length


def _cfg(**kw: Any) -> SearcherConfig:
    base = {"name": "asha", "max_trials": 1_000_000, "max_length": 27, "max_rungs": 4}
    return SearcherConfig(**{**base, **kw})


def simulate(
    s: BaseSearcher, workers: int = 4, until: int | None = None, go_on: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Drive ``s`` to the end (or ``until`` tells): each running trial reports at its
    grant in turn. Returns the ops, the grants' total, the best full-length loss and the
    driver's own state (``go_on`` continues from one, for a restored searcher)."""
    out: dict[str, Any] = {"ops": [], "granted": 0, "best": math.inf, "hp": {}, "grant": {}}
    out["running"] = []
    if go_on is not None:
        out.update({k: go_on[k] for k in ("hp", "grant", "running")}, granted=go_on["granted"])
    hp: dict[int, dict[str, Any]] = out["hp"]
    grant: dict[int, int] = out["grant"]
    running: list[int] = out["running"]
    tells = 0
    while not s.done and (until is None or tells < until):
        for op in s.ask(workers - len(running)):
            out["ops"].append(op)
            if isinstance(op, Create):
                hp[op.request_id], grant[op.request_id] = op.hparams, op.length
                out["granted"] += op.length
                running.append(op.request_id)
            elif isinstance(op, Continue):
                out["granted"] += op.length - grant[op.request_id]
                grant[op.request_id] = op.length
                running.append(op.request_id)
            elif isinstance(op, Stop):
                if op.request_id in running:
                    running.remove(op.request_id)
                s.tell_exited(op.request_id)
        if not running:
            continue
        rid = running.pop(0)
        value = loss(hp[rid], grant[rid])
        s.tell(rid, grant[rid], value)
        tells += 1
        if grant[rid] == s.config.max_length:
            out["best"] = min(out["best"], value)
            s.tell_exited(rid)
    return out


@pytest.mark.parametrize("name", ["asha", "hyperband"])
def test_tpe_beats_random_on_a_synthetic_objective(name: str) -> None:
    """Same budget (40 full trials' worth), 8 seeds: the median best loss of TPE with
    ``fidelity: all`` is well below random's, and the default's (``highest``) below it
    (over 12 seeds: scripts/bench/tpe_synthetic/bench_tpe_synthetic.py)."""
    settings = {"random": {}, "tpe": {}, "tpe-all": {"fidelity": "all"}}
    best = {
        label: statistics.median(
            simulate(
                make_searcher(
                    SPACE,
                    _cfg(
                        name=name,
                        proposer=label.partition("-")[0],
                        proposer_settings=settings[label],
                        seed=seed,
                        max_budget=27 * 40,
                    ),
                )
            )["best"]
            for seed in range(8)
        )
        for label in settings
    }
    assert best["tpe-all"] < 0.75 * best["random"], best
    assert best["tpe"] < best["random"], best


def test_tpe_is_deterministic_and_restores_mid_search() -> None:
    cfg = _cfg(proposer="tpe", proposer_settings={"gamma": 0.2}, seed=3, max_trials=120)
    whole = simulate(make_searcher(SPACE, cfg))["ops"]
    assert whole == simulate(make_searcher(SPACE, cfg))["ops"]
    other = simulate(make_searcher(SPACE, _cfg(proposer="tpe", seed=4, max_trials=120)))["ops"]
    assert other[:10] != whole[:10]
    # stop half-way, restore from JSON, go on: the same operations
    first = make_searcher(SPACE, cfg)
    head = simulate(first, until=150)
    state = json.loads(json.dumps(first.state_dict(), allow_nan=False))
    assert state["proposer"] == {"name": "tpe", "gamma": 0.2}
    again = make_searcher(SPACE, cfg)
    again.load_state_dict(state)
    assert again.state_dict() == first.state_dict()
    assert head["ops"] + simulate(again, go_on=head)["ops"] == whole
    creates = [op for op in whole if isinstance(op, Create)]
    # a model proposes (not random search's configuration) for most later trials
    rand = make_searcher(SPACE, _cfg(seed=3, max_trials=120, proposer="random"))
    random_hps = {
        op.request_id: op.hparams for op in simulate(rand)["ops"] if isinstance(op, Create)
    }
    differ = sum(op.hparams != random_hps.get(op.request_id) for op in creates[40:])
    assert differ > 0.5 * len(creates[40:])


def test_tpe_state_refuses_another_proposer_or_space() -> None:
    s = make_searcher(SPACE, _cfg(proposer="tpe", seed=1, max_trials=30))
    simulate(s, until=20)
    state = s.state_dict()
    with pytest.raises(ValueError, match="other rungs or brackets"):
        make_searcher(SPACE, _cfg(seed=1, max_trials=30, proposer="random")).load_state_dict(state)
    fewer = {k: v for k, v in SPACE.items() if k != "act"}
    with pytest.raises(ValueError, match="malformed state: tpe proposer"):
        make_searcher(fewer, _cfg(proposer="tpe", seed=1, max_trials=30)).load_state_dict(state)


def test_tpe_is_the_default_proposer() -> None:
    """A rung searcher given no proposer makes the decisions of ``proposer: tpe``; the
    loader's rules name it in the config."""
    for name in ("asha", "hyperband"):
        given = simulate(make_searcher(SPACE, _cfg(name=name, seed=2, max_trials=40)))["ops"]
        tpe = _cfg(name=name, seed=2, max_trials=40, proposer="tpe")
        assert given == simulate(make_searcher(SPACE, tpe))["ops"]
    assert make_searcher(SPACE, _cfg(max_trials=4)).state_dict()["proposer"] == {"name": "tpe"}
    problems: list[tuple[tuple[str | int, ...], str]] = []

    class _Report:
        def add(self, path: tuple[str | int, ...], message: str) -> None:
            problems.append((path, message))

    checked = ASHASearcher.check_settings(_cfg(), SPACE, _Report())
    assert problems == []
    assert (checked.proposer, checked.proposer_settings) == ("tpe", dict(TPE_DEFAULTS))


def test_random_proposer_is_random_search() -> None:
    """``proposer: random`` gives trial i random search's trial i."""
    cfg = _cfg(seed=9, max_trials=40, proposer="random")
    ops = simulate(make_searcher(SPACE, cfg))["ops"]
    rand = make_searcher(SPACE, SearcherConfig(name="random", max_trials=40, seed=9, max_length=27))
    expected = [op.hparams for op in rand.ask(40) if isinstance(op, Create)]
    assert [op.hparams for op in ops if isinstance(op, Create)] == expected
    state = make_searcher(SPACE, cfg).state_dict()
    assert state["proposer"] == {"name": "random"} and state["max_budget"] is None
    assert "proposer_points" not in state


def test_tpe_proposer_samples_every_type_inside_the_space() -> None:
    settings, problems = check_tpe_settings({"random_fraction": 0.0, "min_points": 3})
    assert problems == []
    p = TPEProposer(SPACE, 0, True, settings)
    results: dict[int, float] = {}
    for i in range(60):
        h = p.propose(i, {1: [results]})
        assert 0 <= h["x"] <= 1 and 1e-6 <= h["lr"] <= 1 and isinstance(h["width"], int)
        assert 8 <= h["width"] <= 512 and h["act"] in SPACE["act"].vals and h["fixed"] == [1, 2]
        results[i] = loss(h, 1)
    late = statistics.mean(list(results.values())[40:])
    assert late < statistics.mean(list(results.values())[:3])  # it learns, even alone
    with pytest.raises(ValueError, match="out of order"):
        p.propose(70, {})


def test_tpe_settings_are_checked() -> None:
    _, problems = check_tpe_settings(
        {
            "gamma": 1.5,
            "random_fraction": -1,
            "min_points": 1,
            "candidates": True,
            "bandwidth_factor": 0.5,
            "fidelity": "best",
            "other": 1,
        }
    )
    assert sorted(k for k, _ in problems) == [
        "bandwidth_factor",
        "candidates",
        "fidelity",
        "gamma",
        "min_points",
        "other",
        "random_fraction",
    ]


# --- max_budget -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "kw"),
    [
        ("asha", {}),
        ("asha", {"proposer": "tpe"}),
        ("hyperband", {}),
        ("hyperband", {"mode": "conservative"}),
    ],
)
def test_budget_ends_the_search_exactly(name: str, kw: dict[str, Any]) -> None:
    """No trial count: the grants never pass max_budget, and the search ends when
    nothing more fits (no new trial at the first rung, no promotion)."""
    s = make_searcher(SPACE, _cfg(name=name, max_budget=500, seed=2, **kw))
    assert isinstance(s, ASHASearcher)
    run = simulate(s)
    assert s.done and run["granted"] == s.spent <= 500
    smallest = min(p.lengths[0] for p in s.brackets)
    assert 500 - s.spent < smallest or 500 - s.spent < min(
        b - a for p in s.brackets for a, b in zip(p.lengths, p.lengths[1:], strict=False)
    )
    assert run["best"] < math.inf  # it trained some trial to the end


def test_budget_counts_what_a_stopped_trial_did_not_reach() -> None:
    s = make_searcher(SPACE, _cfg(max_budget=100, stop_once=True, max_trials=5))
    ops = s.ask(2)
    assert [op.length for op in ops] == [27, 27] and s.spent == 54
    s.tell(0, 4, 0.5)
    s.tell_exited(0)  # failed at 4 of its 27
    assert s.spent == 31
    assert len(s.ask(5)) == 2 and s.spent == 85  # 15 left: no third 27


def test_budget_sets_sha_trials() -> None:
    s = make_searcher(SPACE, _cfg(name="sha", max_budget=400))
    assert isinstance(s, SHASearcher)
    cost = sha_cost(s.trials, s.lengths, 3)
    assert cost <= 400 < sha_cost(s.trials + 1, s.lengths, 3)
    run = simulate(s)
    assert s.done and run["granted"] <= 400 and s.state_dict()["max_budget"] == 400


def test_budget_below_max_length_is_refused() -> None:
    for name in ("asha", "sha", "hyperband"):
        with pytest.raises(ValueError, match="max_budget 20 < max_length 27"):
            make_searcher(SPACE, _cfg(name=name, max_budget=20))


# --- the experiment file ----------------------------------------------------------

HEAD = "name: t\nentrypoint: python t.py\n"  # two lines: the searcher starts at line 3


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    (tmp_path / "home").mkdir()
    monkeypatch.chdir(tmp_path)
    return {"HOME": str(tmp_path / "home"), "PATH": str(tmp_path), "USER": "alice"}


def _load(env: dict[str, str], text: str) -> SearcherConfig:
    Path("exp.yaml").write_text(HEAD + text)
    return load_experiment("exp.yaml", environ=env).searcher


def _errors(env: dict[str, str], text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        _load(env, text)
    assert info.value.exit_code == 2
    return str(info.value).splitlines()


def test_proposer_and_budget_settings_from_the_file(env: dict[str, str]) -> None:
    s = _load(env, "searcher: {name: asha, max_length: 27, proposer: tpe, max_budget: 5000}\n")
    assert (s.proposer, s.proposer_settings) == ("tpe", dict(TPE_DEFAULTS))
    assert s.max_budget == 5000 and s.max_trials == 1_000_000  # no count: the budget ends it
    assert from_jsonable(SearcherConfig, to_jsonable(s)) == s
    s = _load(
        env,
        "searcher:\n  name: hyperband\n  max_length: 27\n  proposer:\n"
        "    name: tpe\n    gamma: 0.25\n",
    )
    assert s.proposer_settings["gamma"] == 0.25 and s.max_trials == 1 and s.max_budget is None
    s = _load(env, "searcher: {name: asha, max_length: 27, max_trials: 9}\n")
    assert (s.proposer, s.proposer_settings, s.max_budget) == ("tpe", dict(TPE_DEFAULTS), None)
    s = _load(env, "searcher: {name: asha, max_length: 27, max_trials: 9, proposer: random}\n")
    assert (s.proposer, s.proposer_settings) == ("random", {})
    out = _errors(
        env,
        "searcher:\n  name: asha\n  max_length: 27\n  proposer:\n"
        "    name: tpe\n    gamma: 2\n    colour: red\n",
    )
    assert any(
        "exp.yaml:8: searcher.proposer.gamma: must be a number in (0, 1)" in ln for ln in out
    ), out
    assert any("searcher.proposer.colour: unknown setting" in ln for ln in out), out
    out = _errors(env, "searcher: {name: asha, max_length: 27, proposer: gp}\n")
    assert any("exp.yaml:3: searcher.proposer: unknown proposer 'gp'" in ln for ln in out), out
    out = _errors(env, "searcher: {name: random, proposer: tpe, max_budget: 9}\n")
    assert any(
        "searcher.proposer: only applies to searchers 'asha', 'hyperband'" in ln for ln in out
    ), out
    assert any(
        "searcher.max_budget: only applies to searchers 'sha', 'asha', 'hyperband'" in ln
        for ln in out
    ), out
    out = _errors(env, "searcher: {name: sha, max_length: 27, max_budget: 26}\n")
    assert any("searcher.max_budget: must be >= max_length (27" in ln for ln in out), out


def test_tpe_with_a_budget_through_the_orchestrator(tmp_path: Path) -> None:
    """``dlhpc simulate``'s real launch and ticks (the state saved and restored on every
    tick, in its own scratch folder): asha with the tpe proposer and no trial count ends
    when the budget is spent."""
    from dlhpc.config import load_experiment as load
    from dlhpc.simulate import SimSettings, SyntheticCurves, best_reference, simulate_once

    path = tmp_path / "exp.yaml"
    path.write_text(
        "name: sim-tpe\nentrypoint: python train.py\nresources: {time: '01:00:00'}\n"
        "hyperparameters:\n  lr: {type: log, minval: -4, maxval: -1}\n"
        "  width: {type: int, minval: 16, maxval: 256}\n"
        "  act: {type: categorical, vals: [relu, tanh]}\n"
        "searcher:\n  name: asha\n  metric: loss\n  max_length: 9\n  max_budget: 120\n"
        "  proposer: {name: tpe, min_points: 4}\n  max_concurrent_trials: 3\n"
    )
    cfg = load(path, site="local", searchers=SearcherTable())
    src = SyntheticCurves(cfg.hyperparameters, 9, True, 120.0)
    ref = best_reference(src, cfg.hyperparameters, 9, True)
    settings = SimSettings(gpus=4, queue_wait_s=30.0, tick_interval_s=120.0)
    result = simulate_once(cfg, src, settings, ref)
    assert result.state == "COMPLETED", result
    assert result.completed >= 1 and result.stopped_early > 0
    # every trial trained at least the first rung (1): 120 epochs hold at most 120 trials,
    # and more than the 13 of 120 / 9 full ones
    assert 13 < result.trials <= 120
