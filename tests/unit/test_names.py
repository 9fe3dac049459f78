"""Free-form experiment names: any printable text up to 128 characters,
a deterministic ``[a-z0-9-]`` slug, and the name escaped wherever it is shown."""

from __future__ import annotations

import re
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
from rich.console import Console

from dlhpc.cli._views import experiment_view
from dlhpc.config import MAX_NAME_LENGTH, name_slug
from dlhpc.orchestrator.runfiles import entry_script_text
from dlhpc.report._html import render_page
from dlhpc.report._load import load_page
from dlhpc.report.build import INDEX_FILE, write_all
from dlhpc.report.status import status_data
from dlhpc.store import Store
from tests._config import load_experiment
from tests.unit.test_report import T0, _assert_safe, _experiment

HOSTILE_NAME = "<script>alert(\"x\")</script> 'q' $(touch /tmp/pwned) `id` [bold]b[/] & é"
SLUG = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")


@pytest.mark.parametrize(
    "name",
    ["digits-asha", "exp-", "a", "x" * 64, "0abc", "mnist-sweep-v2"],
)
def test_a_name_that_is_already_a_slug_is_its_own_slug(name: str) -> None:
    assert name_slug(name) == name


@pytest.mark.parametrize(
    ("name", "start"),
    [
        ("Digits ASHA", "digits-asha-"),
        ("mnist_sweep.v2", "mnist-sweep-v2-"),
        ("Réseau à 3 couches", "reseau-a-3-couches-"),
        ("../../etc", "etc-"),
        (HOSTILE_NAME, "script-alert-x-script-q-touch-tmp-pwned-id-bold-b-"),
        ("实验 一", ""),
        ("x" * 65, "x" * 55 + "-"),
        ("y" * MAX_NAME_LENGTH, "y" * 55 + "-"),
    ],
)
def test_other_names_get_a_bounded_deterministic_slug(name: str, start: str) -> None:
    slug = name_slug(name)
    assert SLUG.fullmatch(slug) and len(slug) <= 64, slug
    assert slug.startswith(start) and re.fullmatch(r"[0-9a-f]{8}", slug[-8:]), slug
    assert name_slug(name) == slug  # deterministic


def test_names_differing_in_case_or_punctuation_get_different_slugs() -> None:
    slugs = {name_slug(n) for n in ("My Exp", "my exp", "my_exp", "my.exp", "My-Exp")}
    assert len(slugs) == 5


@pytest.mark.parametrize(
    "name",
    ["Digits ASHA (lr sweep, 3 layers)", "Réseau à 3 couches 🚀", "实验 一", HOSTILE_NAME],
)
def test_free_form_names_load(tmp_path: Path, name: str) -> None:
    exp = tmp_path / "exp.yaml"
    quoted = name.replace("\\", "\\\\").replace('"', '\\"')
    exp.write_text(f'name: "{quoted}"\nentrypoint: python t.py\nsite: local\n')
    cfg = load_experiment(exp, environ={"HOME": str(tmp_path), "PATH": "/nonexistent"})
    assert cfg.name == name and cfg.slug == name_slug(name)


def test_the_name_reaches_the_entry_script_only_as_a_comment(tmp_path: Path) -> None:
    exp = tmp_path / "exp.yaml"
    exp.write_text("name: \"x $(touch pwned) `touch pwned2`; touch pwned3\"\nentrypoint: 'true'\n")
    env = {"HOME": str(tmp_path), "PATH": "/nonexistent", "DLHPC_SITE": "local"}
    cfg = load_experiment(exp, environ=env)
    text = entry_script_text(cfg, 1)
    assert [ln for ln in text.splitlines() if "pwned" in ln] == [
        f"# dlhpc experiment 1 ({cfg.name}): written at launch, run by the"
    ]
    (tmp_path / "entry.sh").write_text(text)
    subprocess.run(["bash", str(tmp_path / "entry.sh")], cwd=tmp_path, check=True)
    assert not list(tmp_path.glob("pwned*"))


def test_a_hostile_name_is_escaped_on_pages_and_in_tables(tmp_path: Path) -> None:
    store = Store(tmp_path / "home")
    exp_id = _experiment(store, tmp_path, name=HOSTILE_NAME, space={})
    page = render_page(load_page(store, exp_id, T0 + timedelta(hours=3)))
    _assert_safe(page, (HOSTILE_NAME,))
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &#x27;q&#x27;" in page
    write_all(store, tmp_path / "out", T0 + timedelta(hours=3))
    index = (tmp_path / "out" / INDEX_FILE).read_text(encoding="utf-8")
    _assert_safe(index, (HOSTILE_NAME,))
    # the terminal: rich markup in the name is shown as written, not applied
    with store.read() as s:
        data = status_data(s, exp_id).experiments[0]
    console = Console(width=400, record=True, color_system=None)
    console.print(experiment_view(data))
    assert HOSTILE_NAME in console.export_text()
