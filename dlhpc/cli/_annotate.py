"""``dlhpc tag`` and ``dlhpc note``: label and annotate experiments and trials.

Both take the reconciler lease (:mod:`dlhpc.orchestrator.annotate`); while a tick holds
it they fail with a one-line message (exit 1) and can simply be run again. Another
user's experiment is refused unless the site allows changing it
(``permissions.others_experiments: write``), as for every write.

``dlhpc tag`` reads its arguments itself, after EXPERIMENT_ID: click would read
``-draft`` as the short options ``-d -r -a -f -t``. There, ``-t N`` / ``--trial N``
(or ``-tN``) names a trial (repeatable), ``--json`` and ``--site S`` are the usual
options, ``--`` ends the options (``-- -t`` removes a tag named ``t``, ``-- -t12`` one
named ``t12``), and every other word is a change, ``+TAG`` or ``-TAG``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import click

from dlhpc.cli._common import check_owner, echo_json, open_store, site_option
from dlhpc.errors import UsageError
from dlhpc.orchestrator.annotate import NOTE_MAX_CHARS, add_note, parse_tag_changes, set_tags

__all__ = ["COMMANDS"]


@dataclass
class _TagArgs:
    changes: list[str] = field(default_factory=list)
    trials: list[int] = field(default_factory=list)
    site: str | None = None
    as_json: bool = False


def _trial_id(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise UsageError(f"-t/--trial needs a TRIAL_ID (a number), not {value!r}") from None


def _parse_tail(words: Sequence[str], site: str | None, as_json: bool) -> _TagArgs:
    """The words after EXPERIMENT_ID (see the module doc)."""
    out = _TagArgs(site=site, as_json=as_json)
    it = iter(words)
    for word in it:
        name, eq, inline = word.partition("=")
        if word == "--":
            out.changes.extend(it)
        elif word in ("-t", "--trial", "--site"):
            value = next(it, None)
            if value is None:
                raise UsageError(f"{word} needs a value")
            if word == "--site":
                out.site = value
            else:
                out.trials.append(_trial_id(value))
        elif word[:2] == "-t" and word[2:].isdigit():  # -t12, as click reads it
            out.trials.append(int(word[2:]))
        elif eq and name in ("--trial", "--site"):
            if name == "--site":
                out.site = inline
            else:
                out.trials.append(_trial_id(inline))
        elif word == "--json":
            out.as_json = True
        elif word == "--help":
            ctx = click.get_current_context()
            click.echo(ctx.get_help())
            ctx.exit(0)
        elif word.startswith("--"):
            raise UsageError(f"no option {word} (tag takes -t/--trial, --json, --site)")
        else:
            out.changes.append(word)
    return out


@click.command(
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
    epilog="After EXPERIMENT_ID: +TAG adds, -TAG removes; -t/--trial TRIAL_ID (repeatable)"
    " tags those trials of it instead; --json and --site work there too; -- ends the"
    " options (-- -t removes a tag named t). A tag: 1-64 of letters, digits and . _ : -,"
    " starting with a letter or digit.",
)
@click.argument("experiment_id", type=int)
@click.argument("changes", nargs=-1, type=click.UNPROCESSED)
@site_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def tag(experiment_id: int, changes: tuple[str, ...], site: str | None, as_json: bool) -> None:
    """Add (+TAG) or remove (-TAG) tags of EXPERIMENT_ID, or of its trials with -t TRIAL_ID."""
    args = _parse_tail(changes, site, as_json)
    parsed = parse_tag_changes(args.changes)  # all checked before the store is opened
    store = open_store(args.site)
    check_owner(store, experiment_id=experiment_id)
    result = set_tags(store, experiment_id, parsed, args.trials)
    if args.as_json:
        echo_json({"experiment_id": experiment_id, "tags": result})
        return
    for target, tags in result.items():
        click.echo(f"{target}: {' '.join(tags) if tags else '(no tags)'}")


@click.command(
    epilog=f"A note: 1-{NOTE_MAX_CHARS} characters, no control characters but"
    " newline and tab. Text starting with '-': put -- before it."
)
@click.argument("experiment_id", type=int)
@click.argument("text")
@click.option("-t", "--trial", "trial_id", type=int, default=None, help="A trial of EXPERIMENT_ID.")
@site_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def note(
    experiment_id: int, text: str, trial_id: int | None, site: str | None, as_json: bool
) -> None:
    """Append a note (TEXT) to EXPERIMENT_ID, or to its trial with -t TRIAL_ID."""
    store = open_store(site)
    check_owner(store, experiment_id=experiment_id)
    row = add_note(store, experiment_id, text, trial_id)
    if as_json:
        echo_json({"experiment_id": experiment_id, "note": row})
        return
    click.echo(f"note {row['id']} added to {row['kind']} {row['target_id']}")


COMMANDS = [tag, note]
