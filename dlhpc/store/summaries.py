"""Per-trial summaries of the metric rows, kept on the trial row (``steps_completed``,
``best_metric``, ``latest_metric``) so that status, the searchers and the reports need not
read the rows. Refreshed by the reconciler after each ingest batch."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from dlhpc.store.tables import Metric, Trial

__all__ = ["refresh_metrics"]


def refresh_metrics(s: Session, trials: Sequence[Trial]) -> None:
    """Recompute ``steps_completed`` (the highest step of any metric) and the best and
    latest value of the experiment's searcher metric of each of ``trials``, from the
    metric rows: three grouped queries per experiment, whatever the number of trials."""
    by_exp: dict[int, list[Trial]] = defaultdict(list)
    for t in trials:
        by_exp[t.experiment_id].append(t)
    for group in by_exp.values():
        exp = group[0].experiment
        ids = [t.id for t in group]
        of_metric = (Metric.trial_id.in_(ids), Metric.name == exp.metric)
        steps = dict(
            s.execute(
                select(Metric.trial_id, func.max(Metric.step))
                .where(Metric.trial_id.in_(ids))
                .group_by(Metric.trial_id)
            ).all()
        )
        agg = func.min if exp.smaller_is_better else func.max
        best = dict(
            s.execute(
                select(Metric.trial_id, agg(Metric.value))
                .where(*of_metric)
                .group_by(Metric.trial_id)
            ).all()
        )
        # SQLite takes a bare column from the row that holds the max(): the value at
        # the highest step ((trial, step, name) is unique)
        latest = {
            tid: value
            for tid, _, value in s.execute(
                select(Metric.trial_id, func.max(Metric.step), Metric.value)
                .where(*of_metric)
                .group_by(Metric.trial_id)
            )
        }
        for t in group:
            t.steps_completed = int(steps.get(t.id) or 0)
            t.best_metric = best.get(t.id)
            t.latest_metric = latest.get(t.id)
