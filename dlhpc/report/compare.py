"""``dlhpc report --compare``: experiments or trials side by side, on one page.

:func:`load_compare` builds a :class:`CompareData` (reads only; the page data of
each experiment involved comes from :func:`~dlhpc.report._load.load_page`, so its
curves, redaction and archive rules are those of the experiment pages), and
:func:`write_compare` renders it (:mod:`dlhpc.report._compare_html`) and publishes
the file atomically. What is compared:

* **Experiments** (``EXP_ID ...``, no trials): one *side* per experiment, with every
  trial; the curves chart draws each trial faint and the experiment's best trial
  bold, one colour per experiment. The reproducibility record compared is each
  experiment's best trial's (its lowest id when none has a result).
* **Trials** (``-t TRIAL ...``): one side per trial, one curve each. Experiments
  named with them must hold every trial (a filter, never a second selection).

The table rows (:class:`Row`): a summary (experiment, metric, state, best),
the hyperparameters (in experiment mode the search space and the best trial's
values; in trial mode the values) and the record's differences
(:func:`dlhpc.repro.diff_records`, every side against the first; hyperparameters
are left out of it, the table above has them). A row ``differs`` when its shown
values are not all equal. The parallel-coordinates chart plots every trial of
every side against the hyperparameters (:func:`~dlhpc.report._page_data.hparam_views`
over all of them) and its experiment's metric, one chart per metric name.

Secrets: the experiment pages' rules (:mod:`dlhpc.report._redact`); the records are
redacted as structures before they are compared and each shown cell as text after.

Bad input raises before anything is written: an unknown experiment or trial
(:class:`~dlhpc.errors.NotFoundError`, naming it), a repeated id, fewer than two
sides, or a trial outside the experiments named (:class:`~dlhpc.errors.UsageError`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import select

from dlhpc.errors import NotFoundError, UsageError
from dlhpc.report._compare_data import CompareData, Row, Side
from dlhpc.report._compare_html import render_compare
from dlhpc.report._compare_rows import hparam_rows, record_rows, summary_rows
from dlhpc.report._files import ensure_folder, publish_file
from dlhpc.report._load import load_page
from dlhpc.report._page_data import Page, hparam_views
from dlhpc.report._record import parse_record
from dlhpc.report._redact import redact_text, redact_value
from dlhpc.store import Experiment, Store, Trial
from dlhpc.store.queries import trial_record_of

__all__ = [
    "CompareData",
    "Row",
    "Side",
    "compare_file",
    "load_compare",
    "write_compare",
]

MAX_SIDES = 24  # experiments or trials on one page
_NAME_IDS = 8  # ids spelled out in the default file name


def compare_file(experiment_ids: Sequence[int], trial_ids: Sequence[int]) -> str:
    """The default file name: ``compare-3-7.html``, ``compare-t12-t40.html`` (trials
    name the page when given); past eight ids, ``-and-N-more``."""
    ids = [f"t{t}" for t in trial_ids] if trial_ids else [str(e) for e in experiment_ids]
    more = f"-and-{len(ids) - _NAME_IDS}-more" if len(ids) > _NAME_IDS else ""
    return f"compare-{'-'.join(ids[:_NAME_IDS])}{more}.html"


def _check_ids(experiment_ids: Sequence[int], trial_ids: Sequence[int]) -> None:
    for what, ids in (("experiment", experiment_ids), ("trial", trial_ids)):
        seen: set[int] = set()
        for i in ids:
            if i in seen:
                raise UsageError(f"{what} {i} is named twice")
            seen.add(i)
    sides = len(trial_ids) or len(experiment_ids)
    if sides < 2:
        raise UsageError("--compare needs two experiments or two trials (-t) at least")
    if sides > MAX_SIDES:
        raise UsageError(f"--compare takes at most {MAX_SIDES} experiments or trials")


def _owners(store: Store, experiment_ids: Sequence[int], trial_ids: Sequence[int]) -> list[int]:
    """Each trial's experiment (raising for an unknown id or a trial outside the
    experiments named); the experiments themselves when no trial is named."""
    with store.read() as s:
        known = set(s.scalars(select(Experiment.id).where(Experiment.id.in_(experiment_ids))))
        owner = dict(
            s.execute(select(Trial.id, Trial.experiment_id).where(Trial.id.in_(trial_ids))).all()
        )
    for e in experiment_ids:
        if e not in known:
            raise NotFoundError(f"no experiment {e}")
    for t in trial_ids:
        if t not in owner:
            raise NotFoundError(f"no trial {t}")
        if experiment_ids and owner[t] not in known:
            names = ", ".join(map(str, experiment_ids))
            raise UsageError(
                f"trial {t} belongs to experiment {owner[t]}, not to the experiments named"
                f" ({names})"
            )
    return [owner[t] for t in trial_ids] if trial_ids else list(experiment_ids)


def _space(page: Page) -> dict[str, Any]:
    try:
        config = json.loads(page.config_text or "{}")  # redacted by load_page
    except ValueError:
        return {}
    space = config.get("hyperparameters") if isinstance(config, dict) else None
    return space if isinstance(space, dict) else {}


def _side(page: Page, trial_id: int | None) -> Side:
    """The side of experiment ``page`` (every trial), or of its trial ``trial_id``."""
    if trial_id is None:
        trials, best = page.trials, page.best
        record = best.id if best else (trials[0].id if trials else None)
        key, state = f"experiment {page.id}", page.state
    else:
        one = next(t for t in page.trials if t.id == trial_id)
        trials, record, key, state = (one,), one.id, f"trial {one.id}", one.state
        best = one if one.best is not None and math.isfinite(one.best) else None
    return Side(
        key=key,
        experiment_id=page.id,
        experiment_name=page.name,
        metric=page.metric,
        smaller_is_better=page.smaller_is_better,
        state=state,
        searcher=page.searcher,
        trials=tuple(trials),
        best=best,
        space=_space(page),
        record_trial=record,
    )


def _record(store: Store, side: Side) -> dict[str, Any]:
    """The reproducibility record (as ``dlhpc diff`` builds it) of the side's record
    trial, redacted as structured data (the shown cells are redacted as text too); a
    side without a trial gives its experiment's launch record and config alone."""
    with store.read() as s:
        trial = s.get(Trial, side.record_trial) if side.record_trial is not None else None
        if trial is not None:
            record = trial_record_of(s, trial.id)
        else:
            exp = s.get(Experiment, side.experiment_id)
            assert exp is not None  # its page was loaded
            record = {
                "experiment": parse_record(exp.repro_json),
                "config": parse_record(exp.config_json),
            }
    redacted = redact_value(record)
    return redacted if isinstance(redacted, dict) else {}


def _merged_space(sides: Sequence[Side]) -> dict[str, Any]:
    """Every side's space; for a name in several, the first spec that is not a constant."""
    out: dict[str, Any] = {}
    for side in sides:
        for name, spec in side.space.items():
            current = out.get(name)
            if current is None or (isinstance(current, Mapping) and current.get("type") == "const"):
                out[name] = spec
    return out


def load_compare(
    store: Store,
    experiment_ids: Sequence[int],
    trial_ids: Sequence[int] = (),
    volatile: Collection[str] = (),
    now: datetime | None = None,
) -> CompareData:
    """The compare page's model (see the module doc); reads only (and, as every page
    build, may rewrite stale curve archives). ``volatile``: environment variables left
    out of the record diff (the backends' job ids and the like)."""
    _check_ids(experiment_ids, trial_ids)
    owners = _owners(store, experiment_ids, trial_ids)
    now = now or datetime.now(timezone.utc).replace(tzinfo=None)
    pages: dict[int, Page] = {}
    for eid in owners:
        if eid not in pages:
            pages[eid] = load_page(store, eid, now)
    if trial_ids:
        sides = [_side(pages[e], t) for e, t in zip(owners, trial_ids, strict=True)]
    else:
        sides = [_side(pages[e], None) for e in owners]
    records = [_record(store, s) for s in sides]
    mode = "trials" if trial_ids else "experiments"
    all_trials = [t for s in sides for t in s.trials]
    note = f"Each side against the first ({sides[0].key})"
    if mode == "experiments":
        which = ", ".join(f"{s.key}: trial {s.record_trial}" for s in sides if s.record_trial)
        note += f"; the records of each experiment's best trial ({which})"
    note += (
        ". Hyperparameters are in the table above; environment variables that differ between"
        " any two jobs (job ids, ports) are not compared."
    )
    return CompareData(
        mode=mode,
        sides=tuple(sides),
        hparams=hparam_views(_merged_space(sides), all_trials),
        summary=tuple(summary_rows(sides, mode)),
        hparam_rows=tuple(hparam_rows(sides, mode)),
        record_rows=tuple(
            Row(r.group, redact_text(r.name), tuple(redact_text(v) for v in r.values))
            for r in record_rows(records, volatile)
        ),
        record_note=note,
        generated=now.replace(tzinfo=timezone.utc).timestamp(),
    )


def write_compare(store: Store, model: CompareData, out: Path) -> int:
    """Render ``model`` and publish it at ``out`` atomically; returns its size in bytes."""
    data = render_compare(model).encode("utf-8")
    ensure_folder(out.parent, store)
    publish_file(out, data)
    return len(data)
