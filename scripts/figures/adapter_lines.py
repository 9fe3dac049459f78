"""The lines a training script adds to run under dlhpc, per framework adapter.

Each adapter example under ``templates/examples/<name>/`` holds the script as its user
wrote it before dlhpc (``train_plain.py``) beside the script that runs under dlhpc
(``train.py``); an example may hold another plain script, a common way to write the
same one (``hf-trainer/train_plain_bare.py``: a bare ``trainer.train()``), with a row
of its own. This counts, per row, the lines ``train.py`` adds and changes against the
plain script (a unified diff's ``+`` lines; blank lines and comment-only lines are not
counted) and prints the README's "lines you add" table.

    python scripts/figures/adapter_lines.py            # the markdown table
    python scripts/figures/adapter_lines.py --json     # {row: {"added": n, "removed": n}}

tests/unit/test_adapter_lines.py checks that the README's table is this script's output.
"""

from __future__ import annotations

import argparse
import difflib
import json
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "templates" / "examples"
PLAIN, ADAPTED = "train_plain.py", "train.py"

# row -> (framework as the table names it, how it is brought under dlhpc); a row is an
# example folder (its train_plain.py), or "<folder>:<plain script>"
ADAPTERS: dict[str, tuple[str, str]] = {
    "argparse": ("plain argparse script", "an `entrypoint` template: `--lr {lr}`"),
    "lightning": ("PyTorch Lightning", "`dlhpc.integrations.lightning` callback"),
    "hf-trainer": (
        "Hugging Face `Trainer`, `train(resume_from_checkpoint=...)`",
        "`dlhpc.integrations.transformers` callback",
    ),
    "hf-trainer:train_plain_bare.py": (
        "Hugging Face `Trainer`, bare `trainer.train()`",
        "the callback, and `train()` given the checkpoint",
    ),
    "determined-core": ("Determined Core API", "the `determined` shim, `dlhpc convert determined`"),
}


def _code_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if line.strip() and not line.strip().startswith("#")]


def sources(row: str) -> tuple[Path, str]:
    """The example folder and the plain script's name of an ADAPTERS row."""
    name, _, plain = row.partition(":")
    return EXAMPLES / name, plain or PLAIN


def count(folder: Path, plain_name: str = PLAIN) -> dict[str, int]:
    """``{"added": n, "removed": n}``: code lines of ``train.py`` not in ``plain_name``
    and the reverse. Raises FileNotFoundError when either file is missing."""
    plain = _code_lines((folder / plain_name).read_text().splitlines())
    adapted = _code_lines((folder / ADAPTED).read_text().splitlines())
    added = removed = 0
    for line in difflib.unified_diff(plain, adapted, lineterm="", n=0):
        if line.startswith(("+++", "---", "@@")):
            continue
        added += line.startswith("+")
        removed += line.startswith("-")
    return {"added": added, "removed": removed}


def counts() -> dict[str, dict[str, int]]:
    """The counts of every row whose example exists, in ADAPTERS' order."""
    return {row: count(*sources(row)) for row in ADAPTERS if sources(row)[0].is_dir()}


def table() -> str:
    """The README's table, one row per adapter example."""
    rows = [
        "| your script | how it runs under dlhpc | lines you add | example |",
        "|---|---|---|---|",
    ]
    for row, numbers in counts().items():
        framework, how = ADAPTERS[row]
        name = sources(row)[0].name
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
