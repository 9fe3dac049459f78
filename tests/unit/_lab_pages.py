"""A small lab for the page tests: experiments of two users with tags, notes
and a model version, XSS canaries in every user-supplied string.

The canaries that the commands refuse (a tag with ``<``, a model name with quotes, a
user name) are written straight into the database, as an older tool or another
writer could have: the pages must escape whatever the DB holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dlhpc._perms import current_user
from dlhpc.store import Checkpoint, ModelVersion, Note, Store, Tag, utcnow
from tests.unit._db import add_experiment, add_trial

__all__ = ["CANARIES", "OTHER_USER", "Lab", "make_lab"]

# each would run script (set window.__xss) or add an element if it reached the DOM as markup
CANARIES = (
    "<script>window.__xss=1</script>",
    '"><img src=x onerror="window.__xss=2">',
    "'><svg onload=window.__xss=3>",
)
OTHER_USER = "ada<b>\"'"  # a user name as hostile as the canaries


@dataclass(frozen=True)
class Lab:
    store: Store
    mine: int  # this user's experiment (trials[0], trials[1])
    other: int  # OTHER_USER's experiment
    trials: tuple[int, ...]


def make_lab(home: Path) -> Lab:
    """Two experiments (this user's, OTHER_USER's), tags, notes and a model version,
    every user string holding a canary."""
    store = Store(home)
    now = utcnow()
    with store.write() as s:
        mine = add_experiment(s, home / "a", name="mine " + CANARIES[0], user=current_user())
        t1 = add_trial(s, mine, request_id=0, state="COMPLETED", hparams_json='{"lr": 0.1}')
        t2 = add_trial(s, mine, request_id=1, state="COMPLETED", hparams_json='{"lr": 0.2}')
        other = add_experiment(s, home / "b", name="theirs", user=OTHER_USER)
        add_trial(s, other, state="COMPLETED")
        ck = Checkpoint(trial_id=t1.id, step=3, path=str(home / "ck"), created_at=now)
        s.add(ck)
        s.flush()
        rows: list[object] = [
            Tag(kind="experiment", target_id=mine.id, experiment_id=mine.id, name="best",
                user="u", created_at=now),
            Tag(kind="experiment", target_id=mine.id, experiment_id=mine.id, name=CANARIES[1],
                user="u", created_at=now),
            Tag(kind="experiment", target_id=other.id, experiment_id=other.id, name="paper",
                user="u", created_at=now),
            Tag(kind="trial", target_id=t2.id, experiment_id=mine.id, name=CANARIES[2],
                user="u", created_at=now),
            Note(kind="experiment", target_id=mine.id, experiment_id=mine.id,
                 text="looks good " + CANARIES[0], user=OTHER_USER, created_at=now),
            Note(kind="trial", target_id=t1.id, experiment_id=mine.id,
                 text="trial note " + CANARIES[1], user="u", created_at=now),
            ModelVersion(name="digits" + CANARIES[2], version=1, experiment_id=mine.id,
                         trial_id=t1.id, checkpoint_id=ck.id, step=3, metric=0.25,
                         note="v1 " + CANARIES[0], user=OTHER_USER, created_at=now),
        ]  # fmt: skip
        s.add_all(rows)
        return Lab(store, mine.id, other.id, (t1.id, t2.id))
