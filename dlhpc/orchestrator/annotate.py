"""Tags and notes on experiments and trials (``dlhpc tag``, ``dlhpc note``).

Both write the lab tables (:mod:`dlhpc.store.lab_tables`) under the reconciler lease,
as every write does (principle 2). Everything is checked before anything is written:
one bad tag, an unknown experiment, or a trial of another experiment refuses the
whole call (:class:`~dlhpc.errors.UsageError`, exit 2) and the database is unchanged.

The rules (stated in the README too):

* a tag is :data:`TAG_PATTERN`: 1 to 64 characters, letters, digits and ``. _ : -``,
  starting with a letter or digit (so ``-draft`` can only mean "remove ``draft``");
  ``+name`` adds it, ``-name`` removes it; adding a tag already there and removing one
  that is not there change nothing (idempotent); one name both added and removed in a
  call is refused;
* a note is 1 to :data:`NOTE_MAX_CHARS` characters, not only whitespace, and holds no
  control character but newline and tab, and no bidirectional-override character
  (text that would show differently from what is stored); notes accumulate (newest
  last), each with its user and time.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from dlhpc._perms import current_user
from dlhpc.errors import NotFoundError, UsageError
from dlhpc.store import Experiment, Note, Store, Tag, Trial, utcnow

__all__ = [
    "NOTE_MAX_CHARS",
    "TAG_PATTERN",
    "TagChanges",
    "add_note",
    "check_note",
    "check_tag",
    "parse_tag_changes",
    "set_tags",
]

TAG_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}"
_TAG_RE = re.compile(TAG_PATTERN + r"\Z")
NOTE_MAX_CHARS = 4000
# bidirectional embedding/override/isolate controls: the text would read differently
_BIDI = set("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


@dataclass(frozen=True)
class TagChanges:
    """Tags to add and to remove, in the order given, each once."""

    add: tuple[str, ...]
    remove: tuple[str, ...]


def check_tag(name: str) -> str | None:
    """Why ``name`` is not a valid tag (None: it is)."""
    if _TAG_RE.match(name):
        return None
    if not name:
        return "a tag cannot be empty"
    if len(name) > 64:
        return f"tag {name[:20]!r}... is {len(name)} characters (at most 64)"
    return (
        f"tag {name!r} is not allowed: letters, digits and . _ : - only, starting with a"
        " letter or digit"
    )


def parse_tag_changes(changes: Sequence[str]) -> TagChanges:
    """``+name`` / ``-name`` items as a :class:`TagChanges`; every bad item is reported
    at once (:class:`~dlhpc.errors.UsageError`)."""
    problems: list[str] = []
    add: dict[str, None] = {}
    remove: dict[str, None] = {}
    for item in changes:
        sign, name = item[:1], item[1:]
        if sign not in ("+", "-"):
            problems.append(f"{item!r}: write +TAG to add or -TAG to remove")
            continue
        why = check_tag(name)
        if why is not None:
            problems.append(f"{item!r}: {why}")
            continue
        (add if sign == "+" else remove)[name] = None
    both = sorted(set(add) & set(remove))
    if both:
        problems.append(f"added and removed in one call: {', '.join(both)}")
    if not changes:
        problems.append("no tag given: e.g. +best -draft")
    if problems:
        raise UsageError("bad tags (nothing changed):\n  " + "\n  ".join(problems))
    return TagChanges(tuple(add), tuple(remove))


def check_note(text: str) -> str:
    """``text`` if it is a valid note (see the module doc); else
    :class:`~dlhpc.errors.UsageError`."""
    if not text.strip():
        raise UsageError("the note is empty")
    if len(text) > NOTE_MAX_CHARS:
        raise UsageError(f"the note has {len(text)} characters (at most {NOTE_MAX_CHARS})")
    for i, ch in enumerate(text):
        bad = ch in _BIDI or (unicodedata.category(ch) == "Cc" and ch not in "\n\t")
        if bad:
            raise UsageError(
                f"the note holds the control character U+{ord(ch):04X} at character {i + 1}"
                " (only newline and tab are allowed)"
            )
    return text


def _targets(s: Session, experiment_id: int, trial_ids: Iterable[int]) -> list[tuple[str, int]]:
    """``(kind, id)`` of each target: the experiment, or its trials ``trial_ids``;
    :class:`~dlhpc.errors.NotFoundError` for an unknown experiment or a trial that is
    not the experiment's."""
    if s.get(Experiment, experiment_id) is None:
        raise NotFoundError(f"no experiment {experiment_id}")
    wanted = list(dict.fromkeys(trial_ids))
    if not wanted:
        return [("experiment", experiment_id)]
    rows = s.execute(select(Trial.id, Trial.experiment_id).where(Trial.id.in_(wanted)))
    found = {tid: exp for tid, exp in rows}
    missing = [t for t in wanted if t not in found]
    other = [t for t in wanted if t in found and found[t] != experiment_id]
    problems = [f"no trial {t}" for t in missing]
    problems += [f"trial {t} belongs to experiment {found[t]}, not {experiment_id}" for t in other]
    if problems:
        raise NotFoundError("; ".join(problems) + " (nothing changed)")
    return [("trial", t) for t in wanted]


def set_tags(
    store: Store, experiment_id: int, changes: TagChanges, trial_ids: Sequence[int] = ()
) -> dict[str, list[str]]:
    """Apply ``changes`` to the experiment, or to each of its trials ``trial_ids``,
    under the reconciler lease, in one transaction. Returns each target's tags
    afterwards (sorted), keyed ``experiment <id>`` / ``trial <id>``."""
    with store.hold_lease(), store.write() as s:
        targets = _targets(s, experiment_id, trial_ids)
        now, user = utcnow(), current_user()
        out: dict[str, list[str]] = {}
        for kind, target in targets:
            where = (Tag.kind == kind, Tag.target_id == target)
            have = set(s.scalars(select(Tag.name).where(*where)))
            if changes.remove:
                s.execute(delete(Tag).where(*where, Tag.name.in_(changes.remove)))
            for name in changes.add:
                if name not in have:
                    s.add(
                        Tag(
                            kind=kind,
                            target_id=target,
                            experiment_id=experiment_id,
                            name=name,
                            user=user,
                            created_at=now,
                        )
                    )
            out[f"{kind} {target}"] = sorted((have - set(changes.remove)) | set(changes.add))
        return out


def add_note(
    store: Store, experiment_id: int, text: str, trial_id: int | None = None
) -> dict[str, object]:
    """Append the note ``text`` (checked by :func:`check_note`) to the experiment or to
    its trial ``trial_id``, under the reconciler lease. Returns the note's row as a dict."""
    text = check_note(text)
    with store.hold_lease(), store.write() as s:
        ((kind, target),) = _targets(s, experiment_id, () if trial_id is None else (trial_id,))
        note = Note(
            kind=kind,
            target_id=target,
            experiment_id=experiment_id,
            text=text,
            user=current_user(),
            created_at=utcnow(),
        )
        s.add(note)
        s.flush()
        return {
            "id": note.id,
            "kind": kind,
            "target_id": target,
            "user": note.user,
            "created_at": note.created_at.isoformat() + "Z",
            "text": text,
        }
