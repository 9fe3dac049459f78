"""The submission limits a Slurm site sets on this user, read from its accounting.

Strict sites cap how many jobs a user may hold (``MaxSubmitJobs`` of the
association, ``MaxSubmitJobsPerUser`` of the QOS; every array task counts as a
job), how many may run (``MaxJobs`` / ``MaxJobsPerUser``) and how long one may
ask for (``MaxWall``). :func:`read_limits` reads them with two ``sacctmgr``
queries (the user's associations, the QOS table); the scheduler asks once per
instance, i.e. at most once per tick or launch (:meth:`SlurmScheduler.limits
<dlhpc.scheduler.slurm.scheduler.SlurmScheduler.limits>`).

Which limits bind a job: the association of its account (every association of
the user when the job names none: the smallest limit wins) and its QOS (the
association's default QOS when the job names none, else every QOS the
association allows). Picking the smallest when Slurm's choice is not known
never submits past a limit; at worst it holds back a job Slurm would take.
Names compare case-insensitively: slurmdbd stores them in lower case.

The parsers here are pure; :func:`read_limits` takes the command runner.
"""

from __future__ import annotations

import getpass
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from dlhpc.config import parse_slurm_time
from dlhpc.config.schema import SiteConfig
from dlhpc.errors import SchedulerError
from dlhpc.scheduler.plugins import Check

__all__ = [
    "ASSOC_FORMAT",
    "QOS_FORMAT",
    "Association",
    "Limits",
    "NO_ACCOUNTING",
    "Qos",
    "is_limit_refusal",
    "limits_check",
    "parse_assocs",
    "parse_qos",
    "read_limits",
]

#: ``sacctmgr show assoc`` fields, in the order :func:`parse_assocs` reads them.
ASSOC_FORMAT = (
    "Account,Partition,QOS,DefaultQOS,MaxSubmitJobs,MaxJobs,MaxWallDurationPerJob,GrpTRES"
)
#: ``sacctmgr show qos`` fields, in the order :func:`parse_qos` reads them.
QOS_FORMAT = "Name,MaxSubmitJobsPerUser,MaxJobsPerUser,MaxWall,GrpTRES"

# sbatch's words when a submission breaks a limit (the job would fit later):
# "QOSMaxSubmitJobPerUserLimit", "AssocMaxSubmitJobLimit", "Job violates
# accounting/QOS policy (job submit limit, user's size and/or time limits)"
_REFUSAL_RE = re.compile(r"MaxSubmitJob|accounting/QOS policy|job submit limit", re.IGNORECASE)


def is_limit_refusal(text: str) -> bool:
    """Whether sbatch's error text is a refusal for a site limit (jobs wait, not fail)."""
    return _REFUSAL_RE.search(text) is not None


@dataclass(frozen=True)
class Association:
    """One of the user's associations (``sacctmgr show assoc user=...``)."""

    account: str
    partition: str  # "" for every partition
    qos: tuple[str, ...]
    default_qos: str
    max_submit: int | None
    max_jobs: int | None
    max_wall_minutes: int | None
    grp_tres: str


@dataclass(frozen=True)
class Qos:
    """One QOS (``sacctmgr show qos``); ``None``: no limit."""

    name: str
    max_submit_per_user: int | None
    max_jobs_per_user: int | None
    max_wall_minutes: int | None
    grp_tres: str


def _count(raw: str) -> int | None:
    raw = raw.strip()
    return int(raw) if raw.isdigit() else None


def _minutes(raw: str) -> int | None:
    raw = raw.strip()
    if not raw:
        return None
    try:
        return parse_slurm_time(raw, allow_unlimited=True)
    except ValueError:
        return None


def _rows(text: str, width: int) -> Iterable[list[str]]:
    for line in text.splitlines():
        fields = line.split("|")
        if line.strip() and len(fields) == width:
            yield fields


def parse_assocs(text: str) -> list[Association]:
    """Rows of ``sacctmgr -n -P show assoc format=ASSOC_FORMAT``; others are skipped."""
    return [
        Association(
            account=f[0].strip().lower(),
            partition=f[1].strip().lower(),
            qos=tuple(q.strip().lower() for q in f[2].split(",") if q.strip()),
            default_qos=f[3].strip().lower(),
            max_submit=_count(f[4]),
            max_jobs=_count(f[5]),
            max_wall_minutes=_minutes(f[6]),
            grp_tres=f[7].strip(),
        )
        for f in _rows(text, 8)
    ]


def parse_qos(text: str) -> dict[str, Qos]:
    """Rows of ``sacctmgr -n -P show qos format=QOS_FORMAT``, by lower-case name."""
    out = {}
    for f in _rows(text, 5):
        name = f[0].strip().lower()
        out[name] = Qos(name, _count(f[1]), _count(f[2]), _minutes(f[3]), f[4].strip())
    return out


def _smallest(values: Iterable[int | None]) -> int | None:
    return min((v for v in values if v is not None), default=None)


@dataclass(frozen=True)
class Limits:
    """The user's associations and the site's QOS table."""

    associations: tuple[Association, ...]
    qos: dict[str, Qos]

    def binding(self, account: str | None, qos: str | None) -> tuple[list[Association], list[Qos]]:
        """The associations and QOSes whose limits may bind a job with this account
        and QOS (``None``: the user's default, unknown here, so every candidate)."""
        acct = account.lower() if account else None
        assocs = [a for a in self.associations if acct is None or a.account == acct]
        if qos:
            names = {qos.lower()}
        else:
            names = {a.default_qos or q for a in assocs for q in (a.qos or ("",))}
        return assocs, [self.qos[n] for n in sorted(names) if n in self.qos]

    def max_submit(self, account: str | None, qos: str | None) -> int | None:
        """Jobs (array tasks) the user may hold queued or running; None: no limit."""
        assocs, qoses = self.binding(account, qos)
        return _smallest([*(a.max_submit for a in assocs), *(q.max_submit_per_user for q in qoses)])

    def max_jobs(self, account: str | None, qos: str | None) -> int | None:
        """Jobs the user may run at once (Slurm holds the rest pending); None: no limit."""
        assocs, qoses = self.binding(account, qos)
        return _smallest([*(a.max_jobs for a in assocs), *(q.max_jobs_per_user for q in qoses)])

    def max_wall_minutes(self, account: str | None, qos: str | None) -> int | None:
        """The longest time limit one job may ask for; None: no limit."""
        assocs, qoses = self.binding(account, qos)
        return _smallest(
            [*(a.max_wall_minutes for a in assocs), *(q.max_wall_minutes for q in qoses)]
        )

    def wall_problem(self, account: str | None, qos: str | None, minutes: int) -> str | None:
        """Why a job asking for ``minutes`` would break MaxWall, or None."""
        wall = self.max_wall_minutes(account, qos)
        if wall is None or minutes <= wall:
            return None
        return (
            f"{_show_minutes(minutes)} exceeds the site's MaxWall {_show_minutes(wall)}"
            f" (account {account or '(default)'}, QOS {qos or '(default)'}); ask for at most"
            f" {_show_minutes(wall)} (checkpoints let a trial continue in its next job)"
        )

    def describe(self, account: str | None, qos: str | None) -> str:
        """One line for ``dlhpc doctor`` and the events: the limits that bind."""
        assocs, qoses = self.binding(account, qos)
        grp = sorted({*(a.grp_tres for a in assocs), *(q.grp_tres for q in qoses)} - {""})
        parts = [
            f"MaxSubmitJobs {_show(self.max_submit(account, qos))}",
            f"MaxJobs {_show(self.max_jobs(account, qos))}",
            f"MaxWall {_show_minutes(self.max_wall_minutes(account, qos))}",
        ]
        if grp:
            parts.append(f"GrpTRES {';'.join(grp)}")
        where = f"account {account or '(default)'}, QOS {qos or '(default)'}"
        return f"{', '.join(parts)} ({where}; {len(assocs)} association(s), {len(qoses)} QOS)"


def _show(n: int | None) -> str:
    return "none" if n is None else str(n)


def _show_minutes(minutes: int | None) -> str:
    if minutes is None:
        return "none"
    days, rest = divmod(minutes, 24 * 60)
    text = f"{rest // 60:02d}:{rest % 60:02d}:00"
    return f"{days}-{text}" if days else text


def read_limits(run: Callable[[list[str]], str], user: str) -> Limits:
    """Two ``sacctmgr`` queries through ``run`` (which returns stdout and raises
    :class:`~dlhpc.errors.SchedulerError` when the command fails)."""
    if not re.fullmatch(r"[A-Za-z0-9_.@-]+", user):
        raise ValueError(f"unsafe user name {user!r}")
    base = ["sacctmgr", "-n", "-P", "show"]
    assocs = run([*base, "assoc", f"user={user}", f"format={ASSOC_FORMAT}"])
    qos = run([*base, "qos", f"format={QOS_FORMAT}"])
    return Limits(tuple(parse_assocs(assocs)), parse_qos(qos))


#: ``dlhpc doctor``'s line when sacct fails (``{why}``: its error).
NO_ACCOUNTING = (
    "sacct fails ({why}): dlhpc judges jobs that left the queue by their exit files;"
    " without accounting it cannot learn the exit code or cause of a job that ended"
    " without one (node failure, kill -9, out of memory)"
)


def limits_check(site: SiteConfig, run: Callable[[list[str]], tuple[int, str]]) -> Check:
    """``dlhpc doctor``'s line of the limits that bind the site's account and QOS;
    ``run(cmd)`` returns (exit code, output)."""

    def checked(cmd: list[str]) -> str:
        code, out = run(cmd)
        if code != 0:
            raise SchedulerError(out.splitlines()[-1] if out else f"exit {code}")
        return out

    try:
        limits = read_limits(checked, getpass.getuser())
    except SchedulerError as err:
        return Check("site limits", "warn", f"sacctmgr cannot tell ({err}); none applied")
    return Check("site limits", "ok", limits.describe(site.account, site.qos))
