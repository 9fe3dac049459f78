"""``dlhpc example NAME [DIR]``: a runnable example and its experiment files, from the
package's ``example-templates`` (a checkout's ``templates/examples/``, package data in a
wheel), so that an installed dlhpc needs no checkout to get started."""

from __future__ import annotations

import shutil
from importlib import resources
from pathlib import Path

import click

from dlhpc.errors import UsageError

__all__ = ["COMMANDS", "EXPERIMENT_FILES", "example_root", "examples"]

# Each example's experiment file that its next-step hint launches (the others are in its
# README); an example not named here launches asha.yaml.
EXPERIMENT_FILES = {"digits": "grid.yaml", "deepspeed-lm": "experiment.yaml"}

# Files of a template that are not the user's: the checkout's lint settings.
_SKIPPED = {"ruff.toml"}


def example_root() -> Path:
    """The folder holding one folder per example; RuntimeError when dlhpc is not
    installed as files (a zip file)."""
    root = resources.files("dlhpc") / "example-templates"
    if not isinstance(root, Path):
        raise RuntimeError(f"dlhpc must be installed as files to read its examples; found {root}")
    return root


def examples() -> dict[str, Path]:
    """Example name -> its template folder, sorted by name."""
    return {p.name: p for p in sorted(example_root().iterdir()) if p.is_dir()}


def _summary(folder: Path) -> str:
    """The README's title without the example's name (``# digits: a small ...``)."""
    readme = folder / "README.md"
    title = readme.read_text(encoding="utf-8").splitlines()[0] if readme.is_file() else ""
    return title.lstrip("# ").split(": ", 1)[-1]


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.name not in _SKIPPED)


def write_example(name: str, dest: Path) -> list[Path]:
    """Copy example ``name`` into ``dest`` (created; it must be absent or an empty
    folder) and return the files written. UsageError for an unknown name or a folder
    that is not empty."""
    known = examples()
    if name not in known:
        raise UsageError(f"unknown example {name!r}; one of: {', '.join(known)}")
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise UsageError(f"{dest} exists and is not an empty folder; name a new or empty one")
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    for src in _files(known[name]):
        target = dest / src.name
        shutil.copyfile(src, target)
        written.append(target)
    return written


@click.command()
@click.argument("name", required=False)
@click.argument("folder", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--list", "list_", is_flag=True, help="List the examples and exit.")
def example(name: str | None, folder: Path | None, list_: bool) -> None:
    """Write example NAME with its experiment files into FOLDER (default: ./NAME), a new
    or empty folder; --list names the examples."""
    if list_:
        for known, path in examples().items():
            click.echo(f"{known:<16} {_summary(path)}")
        return
    if name is None:
        raise UsageError("name an example (dlhpc example --list shows them)")
    dest = folder if folder is not None else Path(name)
    written = write_example(name, dest)
    for path in written:
        click.echo(f"wrote {path}")
    experiment = dest / EXPERIMENT_FILES.get(name, "asha.yaml")
    click.echo(f"next: dlhpc launch {experiment} --follow   (see {dest / 'README.md'})")


COMMANDS = [example]
