"""``dlhpc tag`` and ``dlhpc note``, and what ``dlhpc status`` shows of them.

A real Store (SQLite) under a private DLHPC_HOME, the commands through click's
CliRunner. Bad input (tag syntax, unknown experiment or trial, a trial of another
experiment, another user's experiment, a bad note) exits 2 and leaves the lab tables
exactly as they were.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from dlhpc._perms import current_user
from dlhpc.errors import UsageError
from dlhpc.orchestrator.annotate import (
    NOTE_MAX_CHARS,
    check_note,
    check_tag,
    parse_tag_changes,
)
from dlhpc.report.status import iter_status, iter_status_json
from dlhpc.store import Store
from tests.unit._cli import run
from tests.unit._db import add_experiment, add_trial


@pytest.fixture
def lab(home: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Two experiments of this user (trials 1, 2 | 3) and one of another user (trial 4)."""
    monkeypatch.setenv("DLHPC_SITE", "local")
    store = Store(home)
    me = current_user()
    with store.write() as s:
        a = add_experiment(s, home / "a", name="a", user=me)
        t1, t2 = add_trial(s, a, request_id=0), add_trial(s, a, request_id=1)
        b = add_experiment(s, home / "b", name="b", user=me)
        t3 = add_trial(s, b)
        c = add_experiment(s, home / "c", name="c", user="someone-else")
        t4 = add_trial(s, c)
        ids = {"a": a.id, "b": b.id, "c": c.id, "t": [t1.id, t2.id, t3.id, t4.id]}
    return {"store": store, **ids}


def _lab_rows(store: Store) -> list[tuple[Any, ...]]:
    """Every row of the tags and notes tables (what must not change on bad input)."""
    with store.read() as s:
        tags = s.execute(text("SELECT * FROM tags ORDER BY id")).all()
        notes = s.execute(text("SELECT * FROM notes ORDER BY id")).all()
    return [tuple(r) for r in [*tags, *notes]]


def _exp(exp_id: int) -> dict[str, Any]:
    res = run("status", str(exp_id), "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.output)["experiments"][0]  # type: ignore[no-any-return]


def test_tag_syntax() -> None:
    for good in ("best", "a", "v1.2", "lr:0.1", "run_7-b", "X" * 64):
        assert check_tag(good) is None, good
    for bad in ("", "-x", ".x", "a b", "a/b", "<script>", "é", "X" * 65, "a\nb"):
        assert check_tag(bad), bad
    changes = parse_tag_changes(["+best", "-draft", "+best"])
    assert (changes.add, changes.remove) == (("best",), ("draft",))
    with pytest.raises(UsageError) as err:
        parse_tag_changes(["+ok", "best", "+a/b", "+x", "-x"])
    message = str(err.value)  # every problem at once
    assert "'best': write +TAG" in message and "'+a/b'" in message and "x" in message


def test_note_limits() -> None:
    assert check_note("fine\n\twith newline and tab") == "fine\n\twith newline and tab"
    assert check_note("x" * NOTE_MAX_CHARS)
    for bad, why in (
        ("", "empty"),
        ("  \n", "empty"),
        ("x" * (NOTE_MAX_CHARS + 1), "at most"),
        ("bell\x07", "U+0007"),
        ("esc\x1b[31m", "U+001B"),
        ("c1\x85", "U+0085"),
        ("bidi \u202e txt", "U+202E"),
    ):
        with pytest.raises(UsageError, match=re.escape(why)):
            check_note(bad)


def test_tag_and_note_an_experiment_and_its_trials(lab: dict[str, Any]) -> None:
    a, (t1, t2, _, _) = lab["a"], lab["t"]
    res = run("tag", str(a), "+best", "+v1", "-draft")
    assert res.exit_code == 0, res.output
    assert res.output == f"experiment {a}: best v1\n"
    res = run("tag", str(a), "-v1", "+best", "--json")  # idempotent add, options after
    assert json.loads(res.output)["tags"] == {f"experiment {a}": ["best"]}
    res = run("tag", str(a), "+good", "-t", str(t1), f"--trial={t2}")
    assert res.output == f"trial {t1}: good\ntrial {t2}: good\n", res.output
    assert run("tag", str(a), "-draft", "-t", str(t2), "--", "-t").exit_code == 0  # tag "t"
    res = run("tag", str(a), f"-t{t2}", "+t12", "--json")  # -tN: a trial, as click reads it
    assert json.loads(res.output)["tags"] == {f"trial {t2}": ["good", "t12"]}
    res = run("tag", str(a), f"-t{t2}", "--json", "--", "-t12")  # after --: a change
    assert json.loads(res.output)["tags"] == {f"trial {t2}": ["good"]}
    assert run("note", str(a), "first <b>note</b>").exit_code == 0
    assert run("note", str(a), "second\nline").exit_code == 0
    res = run("note", str(a), "-t", str(t1), "--json", "--", "-5% loss")
    note = json.loads(res.output)["note"]
    assert (note["kind"], note["target_id"], note["text"], note["user"]) == (
        "trial",
        t1,
        "-5% loss",
        current_user(),
    )
    exp = _exp(a)
    assert exp["tags"] == ["best"] and exp["user"] == current_user()
    assert exp["note"]["text"] == "second\nline" and exp["note"]["count"] == 2
    by_id = {t["id"]: t for t in exp["trials"]}
    assert by_id[t1]["tags"] == ["good"] and by_id[t1]["note"]["text"] == "-5% loss"
    assert by_id[t2]["tags"] == ["good"] and by_id[t2]["note"] is None
    human = run("status", str(a)).output
    assert "tags: best" in human and "note (" in human and "2 notes): second line" in human
    assert f"trial {t1} note (" in human and "good" in human


@pytest.mark.parametrize(
    "args, message",
    [
        (("tag", "{a}", "+ok", "+bad/x"), "'+bad/x': tag 'bad/x' is not allowed"),
        (("tag", "{a}", "+ok", "plain"), "write +TAG to add or -TAG to remove"),
        (("tag", "{a}", "+ok", "-ok"), "added and removed in one call: ok"),
        (("tag", "{a}"), "no tag given"),
        (("tag", "999", "+ok"), "no experiment 999"),
        (("tag", "{a}", "+ok", "-t", "999"), "no trial 999"),
        (("tag", "{a}", "+ok", "-t", "{t3}"), "trial {t3} belongs to experiment {b}, not {a}"),
        (("tag", "{a}", "+ok", "-t", "x"), "-t/--trial needs a TRIAL_ID"),
        (("tag", "{a}", "+ok", "--bogus"), "no option --bogus"),
        (("tag", "{c}", "+ok"), "belongs to someone-else"),
        (("note", "{a}", "bell\x07"), "control character U+0007"),
        (("note", "{a}", " "), "the note is empty"),
        (("note", "999", "x"), "no experiment 999"),
        (("note", "{a}", "x", "-t", "{t4}"), "trial {t4} belongs to experiment {c}"),
        (("note", "{c}", "x"), "belongs to someone-else"),
        (("status", "{a}", "--tag", "best"), "--tag filters the list"),
        (("status", "--tag", "a/b"), "--tag: tag 'a/b' is not allowed"),
    ],
)
def test_bad_input_exits_2_and_changes_nothing(
    lab: dict[str, Any], args: tuple[str, ...], message: str
) -> None:
    t1, t2, t3, t4 = lab["t"]
    names = {"a": lab["a"], "b": lab["b"], "c": lab["c"], "t3": t3, "t4": t4}
    assert run("tag", str(lab["a"]), "+keep", "-t", str(t1)).exit_code == 0
    assert run("note", str(lab["a"]), "kept").exit_code == 0
    before = _lab_rows(lab["store"])
    assert len(before) == 2
    res = run(*(a.format(**names) for a in args))
    assert res.exit_code == 2, res.output
    assert message.format(**names) in res.output, res.output
    assert _lab_rows(lab["store"]) == before


def test_status_tag_filter_needs_every_tag(lab: dict[str, Any]) -> None:
    a, b = lab["a"], lab["b"]
    run("tag", str(a), "+best", "+paper")
    run("tag", str(b), "+best")
    run("tag", str(b), "+paper", "-t", str(lab["t"][2]))  # a trial's tag: not the experiment's

    def listed(*tags: str) -> list[int]:
        flags = [x for t in tags for x in ("--tag", t)]
        res = run("status", "--json", *flags)
        assert res.exit_code == 0, res.output
        return [e["id"] for e in json.loads(res.output)["experiments"]]

    assert listed("best") == [b, a]
    assert listed("best", "paper") == [a]
    assert listed("paper", "paper") == [a]
    assert listed("nothing") == []
    human = run("status", "--tag", "paper").output
    assert "tags" in human and f"experiment {a} a" in human
    assert "no experiment tagged nothing" in run("status", "--tag", "nothing").output


def test_status_reads_tags_and_notes_in_one_query(
    lab: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """However many experiments and trials are annotated, status reads the lab tables
    once, and the streamed JSON text of each trial equals its typed trial's."""
    a, b = lab["a"], lab["b"]
    t1, t2, t3, _ = lab["t"]
    for exp, trials in ((a, (t1, t2)), (b, (t3,))):
        run("tag", str(exp), "+x")
        run("note", str(exp), "e")
        for t in trials:
            run("tag", str(exp), "+y", "-t", str(t))
            run("note", str(exp), 'n "q" \\ é', "-t", str(t))
    store: Store = lab["store"]
    seen: list[str] = []
    from sqlalchemy import event

    def count(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        if " tags" in statement or " notes" in statement:
            seen.append(statement)

    with store.read() as s:
        event.listen(s.get_bind(), "before_cursor_execute", count)
        try:
            typed = [(e, [json.dumps(t.to_json()) for t in ts]) for e, ts in iter_status(s)]
        finally:
            event.remove(s.get_bind(), "before_cursor_execute", count)
        fast = [(h, [json.dumps(t.to_json()) for t in ts]) for h, ts in iter_status_json(s)]
    assert len(seen) == 1, seen
    assert [texts for _, texts in fast] == [texts for _, texts in typed]
    heads = {e.id: e for e, _ in typed}
    assert heads[a].tags == ("x",) and heads[b].note is not None
    trial = json.loads(typed[-1][1][0])
    assert trial["tags"] == ["y"] and trial["note"]["text"] == 'n "q" \\ é'


def test_tag_help_after_the_id_and_before_it() -> None:
    for args in (("tag", "--help"), ("tag", "3", "--help")):
        res = run(*args)
        assert res.exit_code == 0 and "-t/--trial TRIAL_ID" in res.output, res.output


def test_tag_and_note_fail_at_once_while_a_tick_holds_the_lease(lab: dict[str, Any]) -> None:
    """Both write under the reconciler lease: while another holds it they fail at once
    (exit 1, one line) and change nothing; run again, they succeed."""
    store: Store = lab["store"]
    other = Store(store.home)
    before = _lab_rows(store)
    with other.hold_lease():
        for args in (("tag", str(lab["a"]), "+best"), ("note", str(lab["a"]), "x")):
            res = run(*args)
            assert res.exit_code == 1, res.output
            assert res.output.startswith("error: ") and res.output.count("\n") == 1, res.output
    assert _lab_rows(store) == before
    other.close()
    assert run("tag", str(lab["a"]), "+best").exit_code == 0
    assert len(_lab_rows(store)) == 1
