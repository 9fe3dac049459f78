"""Writes ``searcher-states-v2.json``: the rung searchers' version 2 states and call logs.

It was run once with dlhpc at commit 29ba4ca (asha and hyperband state version 2):
``PYTHONPATH=<that checkout> python tests/data/gen_searcher_states_v2.py``. Each case is
a searcher config, the calls of a seeded random run (``ask`` with its answer, ``tell``,
``tell_exited``) and the state before some of them; ``tests/unit/test_search_tpe.py``
checks that a later dlhpc restored from each state answers as logged.
"""

from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path
from typing import Any

from dlhpc.config.model import HParam, SearcherConfig
from dlhpc.search import Continue, Create, make_searcher

SPACE = {
    "x": HParam("x", "double", minval=0.0, maxval=1.0),
    "width": HParam("width", "int", minval=8, maxval=64),
}
CASES: list[dict[str, Any]] = [
    {"name": "asha", "max_trials": 30, "seed": 11},
    {"name": "asha", "max_trials": 24, "seed": 12, "stop_once": True},
    {"name": "hyperband", "max_trials": 40, "seed": 13},
    {"name": "hyperband", "max_trials": 40, "seed": 14, "mode": "conservative"},
]


def run(case: dict[str, Any]) -> dict[str, Any]:
    cfg = SearcherConfig(**{"max_length": 27, "max_rungs": 4, "metric": "loss", **case})
    s = make_searcher(SPACE, cfg)
    rng = random.Random(case["seed"])
    grants: dict[int, int] = {}
    log: list[list[Any]] = []
    snapshots: list[dict[str, Any]] = []
    while not s.done and len(log) < 600:
        if len(log) % 37 == 5:
            snapshots.append({"at": len(log), "state": s.state_dict()})
        if not grants or rng.random() < 0.3:
            max_new = rng.randint(0, 3)
            ops = s.ask(max_new)
            answer: list[list[Any]] = []
            log.append(["ask", max_new, answer])
            stopped = []
            for op in ops:
                if isinstance(op, Create):
                    answer.append(["create", op.request_id, op.hparams, op.length])
                    grants[op.request_id] = op.length
                elif isinstance(op, Continue):
                    answer.append(["continue", op.request_id, op.length])
                    grants[op.request_id] = op.length
                else:
                    answer.append(["stop", op.request_id])
                    grants.pop(op.request_id, None)
                    stopped.append(op.request_id)
            for rid in stopped:
                s.tell_exited(rid)
                log.append(["exited", rid])
            continue
        rid = rng.choice(sorted(grants))
        if rng.random() < 0.05:  # fails
            grants.pop(rid)
            s.tell_exited(rid)
            log.append(["exited", rid])
            continue
        metric = math.nan if rng.random() < 0.05 else rng.random()
        length = grants.pop(rid)
        s.tell(rid, length, metric)
        log.append(["tell", rid, length, metric])
        if length == cfg.max_length:
            s.tell_exited(rid)
            log.append(["exited", rid])
    return {"searcher": case, "log": log, "snapshots": snapshots}


def main() -> None:
    out = [run(case) for case in CASES]
    Path(sys.argv[1] if len(sys.argv) > 1 else "searcher-states-v2.json").write_text(
        json.dumps(out, indent=None)
    )


if __name__ == "__main__":
    main()
