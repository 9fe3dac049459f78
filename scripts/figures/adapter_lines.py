"""The lines a training script adds to run under dlhpc, per framework adapter.

Each adapter example under ``templates/examples/<name>/`` holds the script as its user
wrote it before dlhpc (``train_plain.py``) beside the script that runs under dlhpc
(``train.py``). This counts, per example, the lines ``train.py`` adds and changes
against ``train_plain.py`` (a unified diff's ``+`` lines; blank lines and comment-only
lines are not counted) and prints the README's "lines you add" table.

    python scripts/figures/adapter_lines.py            # the markdown table
    python scripts/figures/adapter_lines.py --json     # {example: {"added": n, "removed": n}}

tests/unit/test_adapter_lines.py checks that the README's table is this script's output.
"""

from __future__ import annotations

import argparse
import difflib
import json
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "templates" / "examples"
PLAIN, ADAPTED = "train_plain.py", "train.py"

# example folder -> (framework as the table names it, how it is brought under dlhpc)
ADAPTERS: dict[str, tuple[str, str]] = {
    "argparse": ("plain argparse script", "an `entrypoint` template: `--lr {lr}`"),
    "lightning": ("PyTorch Lightning", "`dlhpc.integrations.lightning` callback"),
    "hf-trainer": ("Hugging Face `Trainer`", "`dlhpc.integrations.transformers` callback"),
    "determined-core": ("Determined Core API", "the `determined` shim, `dlhpc convert determined`"),
}


def _code_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if line.strip() and not line.strip().startswith("#")]


def count(folder: Path) -> dict[str, int]:
    """``{"added": n, "removed": n}``: code lines of ``train.py`` not in ``train_plain.py``
    and the reverse. Raises FileNotFoundError when either file is missing."""
    plain = _code_lines((folder / PLAIN).read_text().splitlines())
    adapted = _code_lines((folder / ADAPTED).read_text().splitlines())
    added = removed = 0
    for line in difflib.unified_diff(plain, adapted, lineterm="", n=0):
        if line.startswith(("+++", "---", "@@")):
            continue
        added += line.startswith("+")
        removed += line.startswith("-")
    return {"added": added, "removed": removed}


def counts() -> dict[str, dict[str, int]]:
    """The counts of every adapter example that exists, in ADAPTERS' order."""
    return {name: count(EXAMPLES / name) for name in ADAPTERS if (EXAMPLES / name).is_dir()}


def table() -> str:
    """The README's table, one row per adapter example."""
    rows = [
        "| your script | how it runs under dlhpc | lines you add | example |",
        "|---|---|---|---|",
    ]
    for name, numbers in counts().items():
        framework, how = ADAPTERS[name]
        rows.append(
            f"| {framework} | {how} | {numbers['added']} "
            f"| [`templates/examples/{name}/`](templates/examples/{name}/) |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="counts as JSON")
    args = parser.parse_args()
    print(json.dumps(counts(), indent=2) if args.json else table())


if __name__ == "__main__":
    main()
