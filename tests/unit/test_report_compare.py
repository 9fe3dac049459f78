"""``dlhpc report --compare``: the model (which trials, which rows differ, the record
diff), its SVG charts (a vertex per trial per axis, log and categorical axes), the
page's escaping and the CLI (bad input exits 2 and writes nothing). The page in a
real Chromium: tests/unit/test_report_compare_browser.py."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from dlhpc.cli.main import cli
from dlhpc.errors import NotFoundError, UsageError
from dlhpc.report._compare_html import render_compare
from dlhpc.report._compare_rows import shown, space_text
from dlhpc.report._compare_svg import PALETTE, Series, overlay_svg
from dlhpc.report._curves import Curve
from dlhpc.report._page_data import HParamView, TrialView
from dlhpc.report._parallel import Axis, parallel_svg, ramp
from dlhpc.report.compare import compare_file, load_compare, write_compare
from dlhpc.store import Experiment, Store, Trial
from tests.unit.test_report import HOSTILE, _assert_safe, _experiment, _trial

SPACE_A = {
    "lr": {"type": "log", "minval": -3, "maxval": -1, "base": 10.0, "count": 2},
    "bs": {"type": "categorical", "vals": [32, 64]},
    "dropout": {"type": "const", "value": 0.1},
}
SPACE_B = {
    "lr": {"type": "log", "minval": -4, "maxval": -1, "base": 10.0},
    "bs": {"type": "categorical", "vals": [32, 64, 128]},
    "dropout": {"type": "double", "minval": 0.0, "maxval": 0.5},
}


def _record(commit: str, torch: str) -> str:
    return json.dumps(
        {
            "code": {"kind": "git", "commit": commit, "dirty": False},
            "packages": {"source": "pip", "items": {"torch": torch, "numpy": "2.0"}},
        }
    )


def _two_experiments(store: Store, root: Path) -> dict[str, Any]:
    """Experiment A (2 trials), B (3 trials, one without a result), C (1 trial, A's
    record): ids of each and of their trials."""
    ids: dict[str, Any] = {}
    for name, space, record in (("A", SPACE_A, _record("aaa", "2.4")),) + (
        ("B", SPACE_B, _record("bbb", "2.5")),
        ("C", SPACE_A, _record("aaa", "2.4")),
    ):
        eid = _experiment(store, root / name, name=f"exp-{name}", space=space)
        with store.write() as s:
            e = s.get(Experiment, eid)
            assert e is not None
            e.repro_json = record
        ids[name] = eid
    att = [(0.0, 10.0, "completed")]
    ids["a"] = [
        _trial(store, ids["A"], root, hparams={"lr": 0.001, "bs": 32, "dropout": 0.1},
               state="COMPLETED", losses=[0.9, 0.5, 0.4], attempts=att),
        _trial(store, ids["A"], root, hparams={"lr": 0.1, "bs": 64, "dropout": 0.1},
               state="COMPLETED", losses=[0.8, 0.3, 0.2], attempts=att),
    ]  # fmt: skip
    ids["b"] = [
        _trial(store, ids["B"], root, hparams={"lr": 0.0001, "bs": 128, "dropout": 0.4},
               state="COMPLETED", losses=[0.7, 0.6], attempts=att),
        _trial(store, ids["B"], root, hparams={"lr": 0.01, "bs": 32, "dropout": 0.2},
               state="COMPLETED", losses=[0.6, 0.25, 0.1], attempts=att),
        _trial(store, ids["B"], root, hparams={"lr": 0.05, "bs": 64, "dropout": 0.3},
               state="FAILED", losses=[], attempts=att),
    ]  # fmt: skip
    ids["c"] = [
        _trial(store, ids["C"], root, hparams={"lr": 0.1, "bs": 64, "dropout": 0.1},
               state="COMPLETED", losses=[0.5], attempts=att),
    ]  # fmt: skip
    return ids


@pytest.fixture
def lab(tmp_path: Path) -> tuple[Store, dict[str, Any]]:
    store = Store(tmp_path / "home")
    return store, _two_experiments(store, tmp_path)


def _rows(rows: Any, group: str | None = None) -> dict[str, Any]:
    return {r.name: r for r in rows if group is None or r.group == group}


def test_comparing_experiments_takes_every_trial_and_each_best(
    lab: tuple[Store, dict[str, Any]],
) -> None:
    store, ids = lab
    m = load_compare(store, [ids["A"], ids["B"]])
    assert m.mode == "experiments"
    assert [s.key for s in m.sides] == [f"experiment {ids['A']}", f"experiment {ids['B']}"]
    assert [[t.id for t in s.trials] for s in m.sides] == [ids["a"], ids["b"]]
    a, b = m.sides
    assert a.best is not None and a.best.id == ids["a"][1] and a.record_trial == ids["a"][1]
    assert b.best is not None and b.best.id == ids["b"][1] and b.record_trial == ids["b"][1]
    summary = _rows(m.summary)
    assert summary["trials"].values == ("2", "3") and summary["trials"].differs
    assert summary["best result"].values == ("0.2", "0.1")
    assert not summary["metric"].differs and not summary["searcher"].differs
    space, best = _rows(m.hparam_rows, "space"), _rows(m.hparam_rows, "best trial")
    assert space["lr"].values == ("log 10^[-3, -1] (2 points)", "log 10^[-4, -1]")
    assert space["dropout"].values == ("const 0.1", "double [0, 0.5]")
    assert best["lr"].values == ("0.1", "0.01") and best["lr"].differs
    assert best["bs"].values == ("64", "32")
    # the axes: over every trial; dropout varies across the two, so it is not a const
    assert {h.name: h.kind for h in m.hparams} == {
        "bs": "categorical",
        "dropout": "double",
        "lr": "log",
    }


def test_comparing_trials_one_side_each_and_experiments_as_a_filter(
    lab: tuple[Store, dict[str, Any]],
) -> None:
    store, ids = lab
    picked = [ids["b"][1], ids["a"][0]]
    m = load_compare(store, [ids["A"], ids["B"]], picked)
    assert m.mode == "trials"
    assert [s.key for s in m.sides] == [f"trial {t}" for t in picked]
    assert [[t.id for t in s.trials] for s in m.sides] == [[picked[0]], [picked[1]]]
    assert [s.experiment_id for s in m.sides] == [ids["B"], ids["A"]]
    values = _rows(m.hparam_rows, "value")
    assert values["lr"].values == ("0.01", "0.001") and values["bs"].values == ("32", "32")
    assert values["lr"].differs and not values["bs"].differs
    assert {r.group for r in m.hparam_rows} == {"value"}
    # two trials of one experiment: no experiment named at all
    m = load_compare(store, [], ids["a"])
    assert [s.experiment_id for s in m.sides] == [ids["A"], ids["A"]]
    assert _rows(m.record_rows, "seed") == {}  # same seed in the fixture
    assert {r.name for r in m.record_rows} == set()  # same experiment, same record


def test_the_record_rows_hold_every_sides_value(lab: tuple[Store, dict[str, Any]]) -> None:
    store, ids = lab
    m = load_compare(store, [ids["A"], ids["B"], ids["C"]])
    rows = {(r.group, r.name): r.values for r in m.record_rows}
    assert rows[("code", "commit")] == ("aaa", "bbb", "aaa")  # C equals A: A's value shown
    assert rows[("packages", "torch")] == ("2.4", "2.5", "2.4")
    assert ("packages", "numpy") not in rows  # the same everywhere
    assert all(g != "hparams" for g, _ in rows)  # the table above has them
    assert "experiment" in m.record_note and f"trial {ids['a'][1]}" in m.record_note


@pytest.mark.parametrize(
    ("experiments", "trials", "error", "text"),
    [
        (["A", 999], [], NotFoundError, "no experiment 999"),
        ([], ["a0", 999], NotFoundError, "no trial 999"),
        (["A"], ["a0", "b0"], UsageError, "belongs to experiment"),
        (["A", "A"], [], UsageError, "named twice"),
        ([], ["a0", "a0"], UsageError, "named twice"),
        (["A"], [], UsageError, "two experiments or two trials"),
        ([], ["a0"], UsageError, "two experiments or two trials"),
    ],
)
def test_bad_selections_are_refused(
    lab: tuple[Store, dict[str, Any]],
    experiments: list[Any],
    trials: list[Any],
    error: type[Exception],
    text: str,
) -> None:
    store, ids = lab

    def resolve(x: Any) -> int:
        if x in ("a0", "b0"):
            return int(ids[x[0]][0])
        return int(ids[x]) if isinstance(x, str) else int(x)

    with pytest.raises(error, match=text):
        load_compare(store, [resolve(e) for e in experiments], [resolve(t) for t in trials])


def test_default_file_names() -> None:
    assert compare_file([3, 7], []) == "compare-3-7.html"
    assert compare_file([3, 7], [12, 40]) == "compare-t12-t40.html"
    assert compare_file(list(range(1, 12)), []) == "compare-1-2-3-4-5-6-7-8-and-3-more.html"


def test_shown_values_and_spaces() -> None:
    assert shown(None) == "(none)" and shown(True) == "True" and shown(0.123456) == "0.1235"
    assert shown("a" * 64) == "a" * 12  # a sha256: its prefix
    assert shown({"b": 1, "a": [2]}) == '{"a": [2], "b": 1}'
    assert len(shown("x" * 500)) == 120
    assert space_text({"type": "int", "minval": 32, "maxval": 64}) == "int [32, 64]"
    assert space_text({"type": "categorical", "vals": ["x", 2]}) == 'categorical ["x", 2]'
    assert space_text(0.5) == "0.5"


# -- the charts ------------------------------------------------------------------------


def _tv(tid: int, hp: dict[str, Any], best: float | None, steps: int = 3) -> TrialView:
    values = tuple(1.0 / (i + tid) for i in range(1, steps + 1))
    curve = Curve(tuple(range(1, steps + 1)), values, tuple(float(i) for i in range(steps)))
    return TrialView(tid, "COMPLETED", hp, steps, best, best, curve=curve if steps else None)


def _polylines(svg: str, cls: str | None = None) -> list[dict[str, str]]:
    out = []
    for m in re.finditer(r"<polyline ([^>]*)>", svg):
        attrs = dict(re.findall(r'([\w-]+)="([^"]*)"', m.group(1)))
        if cls is None or attrs.get("class") == cls:
            out.append(attrs)
    return out


def _points(attrs: dict[str, str]) -> list[tuple[int, int]]:
    return [(int(x), int(y)) for x, y in (p.split(",") for p in attrs["points"].split())]


def test_parallel_coordinates_a_vertex_per_trial_per_axis_and_log_axes() -> None:
    hps = (
        HParamView("lr", "log"),
        HParamView("bs", "categorical"),
        HParamView("width", "int"),
        HParamView("seed", "const"),
    )
    trials = [
        _tv(1, {"lr": 1e-3, "bs": "small", "width": 16, "seed": 1}, 0.5),
        _tv(2, {"lr": 1e-2, "bs": "large", "width": 32, "seed": 1}, 0.2),
        _tv(3, {"lr": 1e-1, "bs": "small", "width": 64, "seed": 1}, 0.9),
        _tv(4, {"lr": 1e-2, "bs": "large", "width": 48, "seed": 1}, None),  # no result
    ]
    svg = parallel_svg(hps, [("experiment 1", t) for t in trials], "loss", True)
    assert svg is not None
    lines = {int(a["data-trial"]): a for a in _polylines(svg, "pc")}
    assert sorted(lines) == [1, 2, 3, 4]  # one polyline per trial
    pts = {tid: _points(a) for tid, a in lines.items()}
    assert all(len(pts[t]) == 4 for t in (1, 2, 3))  # lr, bs, width, loss: not the const
    assert len(pts[4]) == 3 and "stroke-dasharray" in lines[4]  # no vertex on the metric
    xs = sorted({x for p in pts.values() for x, _ in p})
    assert len(xs) == 4  # four axes
    # log axis: 1e-3, 1e-2, 1e-1 evenly spaced (a linear one would put 1e-2 near 1e-3)
    ys = [pts[t][0][1] for t in (1, 2, 3)]
    assert abs((ys[0] - ys[1]) - (ys[1] - ys[2])) <= 1 and ys[0] > ys[1] > ys[2]
    assert pts[2][0][1] == pts[4][0][1]  # same lr, same place
    # categorical: two places, the same value on the same place
    assert pts[1][1][1] == pts[3][1][1] != pts[2][1][1] == pts[4][1][1]
    # colour: the best (smallest loss, trial 2) darkest, the worst the light end
    assert lines[2]["stroke"] == ramp(1.0) and lines[3]["stroke"] == ramp(0.0)
    assert "lr (log)" in svg and ">width<" in svg and ">seed<" not in svg


def test_parallel_and_overlay_need_something_to_draw() -> None:
    t = _tv(1, {"a": 1}, 0.5, steps=0)
    assert parallel_svg((HParamView("a", "const"),), [("x", t)], "m", True) is None
    assert overlay_svg([Series(0, "x", t, True)], "m") is None
    axis = Axis("lr", "log", [0.002, 0.003])  # within one decade: its two ends labelled
    assert len(axis.labels()) == 2 and axis.y(-1) is None and axis.y("x") is None
    assert ramp(2.0) == ramp(1.0) == "#440154"


def test_the_overlay_colours_each_side_and_draws_the_best_bold_on_top() -> None:
    a = [_tv(1, {}, 0.3), _tv(2, {}, 0.2)]
    b = [_tv(3, {}, 0.1), _tv(4, {}, 0.4, steps=1)]
    series = [Series(0, "A", t, t.id == 2) for t in a] + [Series(1, "B", t, t.id == 3) for t in b]
    svg = overlay_svg(series, "loss")
    assert svg is not None
    lines = _polylines(svg)
    assert [ln["stroke"] for ln in lines] == [PALETTE[0], PALETTE[0], PALETTE[1]]
    assert [ln["stroke-width"] for ln in lines] == ["1", "2.5", "2.5"]  # bold last
    assert svg.count("<path ") == 1  # trial 4's single point: a dot
    assert "A, trial 2 (COMPLETED)" in svg


# -- the page ---------------------------------------------------------------------------


def test_hostile_names_values_and_records_are_text(tmp_path: Path) -> None:
    h0, h1, h2, h3, h4 = HOSTILE
    store = Store(tmp_path / "home")
    space = {h2: {"type": "categorical", "vals": [h3, h4]}, "lr": {"type": "log"}}
    e1 = _experiment(store, tmp_path, name=h0, metric=h1, space=space)
    e2 = _experiment(store, tmp_path, name=h4, metric=h1, space=space)
    with store.write() as s:
        for eid, torch in ((e1, h3), (e2, "2.5")):
            e = s.get(Experiment, eid)
            assert e is not None
            e.repro_json = _record(h0, torch)
    att = [(0.0, 10.0, "completed")]
    for eid, (v, lr) in ((e1, (h3, 0.01)), (e2, (h4, 0.1)), (e2, (h3, 0.001))):
        _trial(store, eid, tmp_path, hparams={h2: v, "lr": lr}, state="COMPLETED",
               losses=[0.5, 0.4], attempts=att, metric=h1)  # fmt: skip
    html = render_compare(load_compare(store, [e1, e2]))
    tags = _assert_safe(html, HOSTILE)
    assert sum(1 for t, _ in tags.tags if t == "svg") >= 2 + 2  # 2 charts + swatches
    assert 'class="diff"' in html and "≠" in html
    out = tmp_path / "deep" / "cmp.html"
    n = write_compare(store, load_compare(store, [e1, e2]), out)
    assert out.stat().st_size == n


def test_the_page_has_every_section(lab: tuple[Store, dict[str, Any]]) -> None:
    store, ids = lab
    html = render_compare(load_compare(store, [ids["A"], ids["B"]]))
    for heading in ("Summary", "Learning curves", "Hyperparameters", "parallel coordinates"):
        assert heading in html
    assert html.count('class="pc"') == 5  # every trial of both experiments
    assert "Reproducibility record: what differs" in html and ">commit<" in html


# -- the CLI ----------------------------------------------------------------------------


def test_report_compare_command(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store(home)
    ids = _two_experiments(store, tmp_path)
    a, b = str(ids["A"]), str(ids["B"])
    monkeypatch.chdir(tmp_path)
    env = {"DLHPC_SITE": "local"}

    def run(*args: str) -> Any:
        return CliRunner().invoke(cli, ["report", *args], env=env)

    bad = [
        (["--compare", a, "999"], "no experiment 999"),
        (["--compare", a, "-t", "999", "-t", str(ids["a"][0])], "no trial 999"),
        (["--compare", a, "-t", str(ids["b"][0]), "-t", str(ids["a"][0])], "belongs to"),
        (["--compare", a], "two experiments or two trials"),
        (["--compare", a, b, "--all"], "not with --all"),
        (["--compare", a, b, "--out-dir", "x"], "not with --all"),
        ([a, b], "add --compare"),
        ([a, "-t", str(ids["a"][0])], "goes with --compare"),
    ]
    db_before = (home / "dlhpc.db").read_bytes()
    for args, text in bad:
        r = run(*args, "-o", str(tmp_path / "bad.html"))
        assert r.exit_code == 2, (args, r.output)
        assert text in r.output, (args, r.output)
    assert not (tmp_path / "bad.html").exists()
    assert (home / "dlhpc.db").read_bytes() == db_before  # nothing changed
    assert not list(tmp_path.glob("compare-*.html"))
    r = run("--compare", a, b)
    assert r.exit_code == 0, r.output
    assert f"wrote compare-{a}-{b}.html" in r.output
    assert "Comparing 2 experiments" in (tmp_path / f"compare-{a}-{b}.html").read_text()
    t1, t2 = ids["a"][0], ids["b"][1]
    r = run("--compare", "-t", str(t1), "-t", str(t2), "-q")
    assert r.exit_code == 0 and r.output == ""
    assert "Comparing 2 trials" in (tmp_path / f"compare-t{t1}-t{t2}.html").read_text()
    out = tmp_path / "sub" / "c.html"
    r = run("--compare", a, b, "-o", str(out))
    assert r.exit_code == 0 and out.is_file()


def test_an_experiment_without_trials_is_compared_too(tmp_path: Path) -> None:
    store = Store(tmp_path / "home")
    e1 = _experiment(store, tmp_path, name="one")
    e2 = _experiment(store, tmp_path, name="empty")
    with store.write() as s:
        e = s.get(Experiment, e1)
        assert e is not None
        e.repro_json = _record("aaa", "2.4")
    _trial(store, e1, tmp_path, hparams={"lr": 0.1, "bs": 8}, state="COMPLETED",
           losses=[0.5], attempts=[(0.0, 1.0, "completed")])  # fmt: skip
    m = load_compare(store, [e1, e2])
    summary = _rows(m.summary)
    assert summary["trials"].values == ("1", "0") and summary["best trial"].values[1] == "-"
    assert m.sides[1].record_trial is None
    assert {(r.group, r.name): r.values for r in m.record_rows} == {
        ("record", "experiment"): ("recorded", "(none)"),  # its launch record is all it has
        ("seed", "seed"): ("0", "(none)"),
        ("max_length", "max_length"): ("9", "(none)"),
    }
    html = render_compare(m)
    assert "Comparing 2 experiments" in html and html.count('class="pc"') == 1


def test_no_secret_of_the_records_reaches_the_page(tmp_path: Path) -> None:
    """Secrets in the launch records, the attempts' environments and hyperparameters
    (named like a secret, or as ``token=...`` inside a value) stay off the page, also
    where the two sides differ."""
    secrets = [f"s3cr3t-{i:02d}-xxxxxx" for i in range(8)]
    store = Store(tmp_path / "home")
    eids = []
    for i in range(2):
        eid = _experiment(store, tmp_path / str(i), name=f"e{i}", space={})
        with store.write() as s:
            e = s.get(Experiment, eid)
            assert e is not None
            e.repro_json = json.dumps(
                {
                    "code": {"kind": "git", "commit": f"c{i}",
                             "remote": f"https://me:{secrets[0 + i]}@github.com/lab/r{i}.git"},
                    "packages": {"items": {"pkg": f"@ git+https://o:{secrets[2 + i]}@x/p{i}.git"}},
                    "modules": {"loaded": [f"mod{i}/1.0?token={secrets[4 + i]}"]},
                }
            )  # fmt: skip
        hp = {"api_key": secrets[6 + i], "lr": 0.1 * (i + 1)}
        tid = _trial(store, eid, tmp_path, hparams=hp, state="COMPLETED", losses=[0.5],
                     attempts=[(0.0, 1.0, "completed")])  # fmt: skip
        with store.write() as s:
            t = s.get(Trial, tid)
            assert t is not None
            for a in t.attempts:
                a.env_json = json.dumps({"nodes": "n1", "env": {"HF_TOKEN": secrets[i]}})
        eids.append(eid)
    html = render_compare(load_compare(store, eids))
    assert [s for s in secrets if s in html] == []
    assert "github.com/lab/r1.git" in html and ">mod0<" in html  # the rest is shown
    assert "&lt;redacted&gt;" in html
