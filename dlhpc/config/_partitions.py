"""A job's partition checked against the Slurm cluster itself.

The site's ``partitions:`` list (when it has one) is checked first while
loading (:mod:`dlhpc.config._experiment`), for its per-partition limits; it may
still name a partition the cluster does not have (or a site may list none,
e.g. ``generic``), which sbatch would only refuse after the experiment was
recorded. So for a Slurm launch the caller passes a function returning the
cluster's partition names (one ``sinfo`` call), asked at most once, and only
when a partition is set and passed the site's check. An unknown partition is
then a config error at the line that set it: ``resources.partition`` in the
experiment, else ``partition`` in the site file; the message lists the valid ones.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

from dlhpc.config._validate import Issues, did_you_mean, fmt_path
from dlhpc.config._yaml import read_yaml_file
from dlhpc.config.schema import SiteConfig
from dlhpc.errors import ConfigError, ConfigIssue

__all__ = ["PartitionLister", "PartitionsOnly", "check_cluster_partition", "site_issue"]

#: Returns the partition names the cluster has (e.g. ``sinfo --all -h -o %R``).
PartitionLister = Callable[[], Collection[str]]


class PartitionsOnly:
    """Cluster rules that know the partitions only (from a :data:`PartitionLister`):
    default partition, GPU types and associations unknown (not checked)."""

    def __init__(self, lister: PartitionLister) -> None:
        self.partitions = lister

    def default_partition(self) -> str | None:
        return None

    def gpu_types(self, partition: str) -> Collection[str] | None:
        return None

    def associations(self) -> Mapping[str, Collection[str]] | None:
        return None


def check_cluster_partition(
    issues: Issues,
    site: SiteConfig,
    partition: str | None,
    from_experiment: bool,
    lister: PartitionLister,
) -> list[ConfigIssue]:
    """Report each name of ``partition`` (``a,b`` allowed) the cluster lacks.

    ``from_experiment``: the experiment set ``resources.partition`` (a problem
    then goes to ``issues``), else it is the site's default (a problem is
    returned: it belongs to the site file). Errors of ``lister`` propagate.
    """
    if partition is None:
        return []
    known = sorted(set(lister()))
    out: list[ConfigIssue] = []
    for part in partition.split(","):
        if part in known:
            continue
        message = (
            f"partition {part!r} does not exist on this Slurm cluster; "
            f"{did_you_mean(part, known)}(valid: {', '.join(known) or 'none'})"
        )
        if from_experiment:
            issues.add(("resources", "partition"), message)
        else:
            out.append(site_issue(site, message))
    return out


def site_issue(
    site: SiteConfig, message: str, key: tuple[str, ...] = ("partition",)
) -> ConfigIssue:
    """``message`` as a problem of the site file at ``key`` (its line when the file
    still reads)."""
    label = str(site.source) if site.source is not None else site.name
    line = None
    if site.source is not None:
        try:
            line = read_yaml_file(site.source, label).lines.get(key)
        except ConfigError:
            line = None  # the file changed since it loaded: name it without a line
    return ConfigIssue(label, line, fmt_path(key), message)
