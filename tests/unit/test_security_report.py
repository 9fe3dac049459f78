"""Report pages hold no secrets, and every user text on them is escaped.

Secrets are put into every place from which one could reach a page: the YAML as
given and the resolved config (environment vars, site env, the entrypoint's flags,
a hyperparameter named like a token), the launch record (git remote with
credentials, a package URL with a token, the uncommitted diff), the attempts'
environment records, trial errors (log tails) and log events.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

from dlhpc.report._html import render_page
from dlhpc.report._load import load_page
from dlhpc.report._redact import redact_text, redact_value
from dlhpc.report.build import write_all
from dlhpc.store import Event, Experiment, Store, Trial
from tests.unit.test_report import HOSTILE, T0, _assert_safe, _experiment, _trial

S = [f"s3cr3t-{i:02d}-{'x' * 6}" for i in range(20)]  # each must not appear anywhere

YAML = f"""\
name: leaky
description: "uses WANDB_API_KEY={S[0]}"
entrypoint: python train.py --api-token {S[1]} --hf_token={S[2]} --lr 0.1
environment:
  setup: |
    export HF_TOKEN={S[3]}
    export DB_PASSWORD='{S[4]}'
  vars: {{WANDB_API_KEY: "{S[5]}", OMP_NUM_THREADS: 4}}
hyperparameters:
  api_key: {S[6]}
  auth:
    type: categorical
    vals: [{S[7]}, {S[8]}]
  lr: 0.1
"""


def _config() -> dict[str, object]:
    return {
        "entrypoint": f"python train.py --api-token {S[1]} --hf_token={S[2]} --lr 0.1",
        "environment": {"setup": f"export HF_TOKEN={S[3]}\n", "vars": {"WANDB_API_KEY": S[5]}},
        "site": {"env": {"AWS_SECRET_ACCESS_KEY": S[9], "NCCL_SOCKET_IFNAME": "eth0"}},
        "hyperparameters": {
            "api_key": {"type": "const", "val": S[6]},
            "auth": {"type": "categorical", "vals": [S[7], S[8]]},
            "lr": {"type": "const", "val": 0.1},
        },
        "searcher": {"name": "grid", "max_length": 3},
        "reproducibility": {"seed": 1, "deterministic": False},
    }


def test_no_secret_reaches_a_report_page(tmp_path: Path) -> None:
    store = Store(tmp_path / "home")
    exp_id = _experiment(store, tmp_path, name="leaky", space={})
    with store.write() as s:
        e = s.get(Experiment, exp_id)
        assert e is not None
        e.yaml_text, e.config_json, e.description = YAML, json.dumps(_config()), f"token={S[0]}"
        e.repro_json = json.dumps(
            {
                "code": {
                    "kind": "git",
                    "commit": "abc",
                    "remote": f"https://me:{S[10]}@github.com/lab/repo.git",
                    "root": "/home/me/repo",
                    "diff": f'+API_KEY = "{S[11]}"\n+password: {S[12]}\n',
                },
                "packages": {
                    "source": "pip freeze",
                    "items": {"private-pkg": f"@ git+https://oauth2:{S[13]}@gitlab.lab/pkg.git"},
                },
                "modules": {"loaded": [f"secretmod/1.0?token={S[14]}"]},
            }
        )
    tid = _trial(
        store,
        exp_id,
        tmp_path,
        hparams={"api_key": S[6], "auth": S[7], "lr": 0.1},
        state="FAILED",
        losses=[0.5],
        attempts=[(0, 5, "crash")],
    )
    with store.write() as s:
        t = s.get(Trial, tid)
        assert t is not None
        t.error = f"Traceback ...\nKeyError: bad\nGITHUB_TOKEN={S[15]} printed by the script"
        for a in t.attempts:
            a.env_json = json.dumps(
                {
                    "nodes": "node1",
                    "cpu": {"model": "x"},
                    "env": {"HF_TOKEN": S[16], "MY_SECRET": S[17], "OMP_NUM_THREADS": "4"},
                }
            )
        s.add(
            Event(
                experiment_id=exp_id,
                trial_id=tid,
                time=T0,
                kind="log.warning",
                message=f"logging in with password={S[18]} to https://u:{S[19]}@host/x",
            )
        )
    now = T0 + timedelta(hours=3)
    html = render_page(load_page(store, exp_id, now))
    assert [s for s in S if s in html] == []
    assert html.count("&lt;redacted&gt;") >= 15  # the names stay, the values go
    for name in ("WANDB_API_KEY", "HF_TOKEN", "api_key", "AWS_SECRET_ACCESS_KEY", "--api-token"):
        assert name in html
    assert "eth0" in html and "github.com/lab/repo.git" in html  # the rest is still shown
    out = tmp_path / "site"
    write_all(store, out, now=now)
    for page in out.iterdir():
        text = page.read_text()
        assert [s for s in S if s in text] == [], page


def test_redaction_of_text_and_structures() -> None:
    assert redact_text("export HF_TOKEN=abc OTHER=1") == "export HF_TOKEN=<redacted> OTHER=1"
    assert redact_text('{"api_key": "abc", "lr": 1}') == '{"api_key": "<redacted>", "lr": 1}'
    assert redact_text("--password hunter2 --lr 0.1") == "--password <redacted> --lr 0.1"
    assert redact_text("git clone https://u:p@h/x") == "git clone https://<redacted>@h/x"
    block = "vars:\n  SECRET:\n    - a\n    - b\nnext: 1\n"
    assert redact_text(block) == "vars:\n  SECRET:\n    <redacted>\n    <redacted>\nnext: 1\n"
    assert redact_text("lr: 0.1\nname: x") == "lr: 0.1\nname: x"
    assert redact_value({"a": {"Token": [1]}, "b": ["https://x@h"]}) == {
        "a": {"Token": "<redacted>"},
        "b": ["https://<redacted>@h"],
    }


def test_user_text_in_paths_and_names_is_escaped(tmp_path: Path) -> None:
    """Beyond tests/unit/test_report.py's hostile names: the run folder and the trials'
    folders (log paths) and an error naming a log path."""
    h0, h1, h2, h3, h4 = HOSTILE
    store = Store(tmp_path / "home")
    exp_id = _experiment(store, tmp_path, name=h0, metric=h1, space={h2: {"type": "log"}})
    with store.write() as s:
        e = s.get(Experiment, exp_id)
        assert e is not None
        e.run_dir = f"/runs/{h3}"
    tid = _trial(
        store,
        exp_id,
        tmp_path,
        hparams={h2: h4},
        state="FAILED",
        losses=[0.1],
        attempts=[(0, 1, "crash")],
        metric=h1,
    )
    with store.write() as s:
        t = s.get(Trial, tid)
        assert t is not None
        t.run_dir = f"/runs/{h4}/trial"
        t.error = f"see /runs/{h3}/trials/stdout.log: {h0}"
    _assert_safe(render_page(load_page(store, exp_id, T0 + timedelta(hours=3))), HOSTILE)
