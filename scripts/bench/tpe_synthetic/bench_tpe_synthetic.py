#!/usr/bin/env python3
"""Benchmark: the ``tpe`` proposer against ``random`` on a synthetic objective, no clock.

Drives ``asha`` and ``hyperband`` with ``proposer: random``, ``tpe`` (its default
``fidelity: highest``) and ``tpe`` with ``fidelity: all`` through the pure simulation of
``tests/unit/test_search_tpe.py`` (4 workers, a budget of 40 full trials, its objective
and space) for seeds ``0..--seeds-1``, and prints the median over the seeds of the best
full-length loss (``--json PATH``: also writes it there). The optimum of the objective is
``OPTIMUM``.

    . .venv/bin/activate
    python scripts/bench/tpe_synthetic/bench_tpe_synthetic.py --seeds 12
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _result import write_result  # noqa: E402

from dlhpc.search import make_searcher  # noqa: E402
from tests.unit.test_search_tpe import SPACE, _cfg, simulate  # noqa: E402

OPTIMUM = 0.3 / 27  # f(x) = 0 at the best point, plus 0.3 / max_length
PROPOSERS: dict[str, tuple[str, dict[str, Any]]] = {  # label: (proposer, its settings)
    "random": ("random", {}),
    "tpe": ("tpe", {}),
    "tpe-all": ("tpe", {"fidelity": "all"}),
}


def best_losses(name: str, proposer: tuple[str, dict[str, Any]], seeds: int) -> list[float]:
    """The best full-length loss of each seed's search, budget 40 full trials."""
    kind, settings = proposer
    return [
        simulate(
            make_searcher(
                SPACE,
                _cfg(
                    name=name,
                    proposer=kind,
                    proposer_settings=settings,
                    seed=s,
                    max_budget=27 * 40,
                ),
            )
        )["best"]
        for s in range(seeds)
    ]


def main() -> int:
    """Runs every searcher and proposer; prints (and with ``--json`` writes) the medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=12)
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args()
    result: dict[str, Any] = {"seeds": args.seeds, "optimum": round(OPTIMUM, 4), "median_best": {}}
    for name in ("asha", "hyperband"):
        result["median_best"][name] = {
            label: round(statistics.median(best_losses(name, proposer, args.seeds)), 4)
            for label, proposer in PROPOSERS.items()
        }
    print(json.dumps(result, indent=1))
    if args.json is not None:
        write_result(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
