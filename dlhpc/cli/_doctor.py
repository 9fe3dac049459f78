"""``dlhpc doctor`` (is this site usable?) and ``dlhpc db`` (schema upkeep)."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import click
from rich.table import Table
from rich.text import Text

from dlhpc._perms import make_member_home, member_home
from dlhpc.cli._common import backends, echo_json, site_option, use_site
from dlhpc.cli._console import console
from dlhpc.cli._doctor_perms import permission_checks
from dlhpc.config import load_site
from dlhpc.config.schema import SiteConfig
from dlhpc.errors import DlhpcError, UsageError
from dlhpc.orchestrator.disk_space import shared_small_filesystem
from dlhpc.report.quota import lustre_quota, quota_warning
from dlhpc.scheduler.plugins import BackendTable, Check
from dlhpc.store import default_home
from dlhpc.store.engine import SCHEMA_VERSION, make_engine, read_version
from dlhpc.store.engine import migrate as run_migrations
from dlhpc.store.store import DB_NAME

__all__ = ["COMMANDS"]

_NETWORK_FS = {"nfs", "nfs4", "lustre", "gpfs", "cifs", "smb2", "beegfs", "fuse.sshfs"}


def _run(cmd: list[str]) -> tuple[int, str]:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return 127, str(err)
    return p.returncode, (p.stdout + p.stderr).strip()


def fs_type(path: Path) -> str:
    p = path
    while not p.exists():
        p = p.parent
    code, out = _run(["stat", "-f", "-c", "%T", str(p)])
    return out if code == 0 else "unknown"


def _writable(path: Path) -> tuple[bool, str]:
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".dlhpc-doctor-"):
            pass
        return True, str(path)
    except OSError as err:
        return False, f"{path}: {err.strerror}"


def run_checks(site: SiteConfig) -> list[Check]:
    """Every registered backend's own checks (each skips a site that is not its), then
    the folders, quota, permissions and filesystems."""
    backends = BackendTable()
    checks = [c for name in backends.names() for c in backends.get(name).doctor_checks(site)]
    home = member_home(default_home(site.state_dir), site.permissions)
    try:  # group mode: the lab's folders get their modes, as a first launch gives them
        make_member_home(default_home(site.state_dir), site.permissions)
    except (OSError, DlhpcError) as err:
        checks.append(Check("state folder writable", "fail", str(err)))
    for label, path in (("state folder", home), ("checkpoint folder", site.scratch.expanduser())):
        ok, detail = _writable(path)
        checks.append(Check(f"{label} writable", "ok" if ok else "fail", detail))
    checks.append(_quota_check(site.scratch.expanduser()))
    checks += permission_checks(site)
    mounts = read_mounts()
    checks.append(db_filesystem_check(home, site.journal_mode, mounts))
    checks.append(checkpoint_space_check(home, site.scratch.expanduser()))
    checks += shared_folder_checks(site, home, mounts, _jobs_elsewhere(backends, site))
    return checks


def _jobs_elsewhere(backends: BackendTable, site: SiteConfig) -> bool:
    """Whether the site's backend (``auto`` resolved here) can run jobs on other machines."""
    name = backends.auto(os.environ) if site.backend == "auto" else site.backend
    backend = backends.get(name)
    return not backend.runs_here and backend.available(os.environ)


# --- where the DB and the run folders live (shared filesystems) -----------------

_LOCAL_FS = {"xfs", "btrfs", "tmpfs", "zfs", "overlay", "overlayfs", "f2fs", "jfs", "ramfs"}
_DB_RULE = (
    " Only the reconciler holding the lease writes it (one `dlhpc tick` at a time, from cron on"
    " one login node; a second one exits quietly), and jobs never open it: never open it from a"
    " compute node. It has no path of its own: it lives in DLHPC_HOME (the site's state_dir)"
    " with the run folders, which the compute nodes must see."
)


@dataclass(frozen=True)
class Mount:
    point: str
    fstype: str
    options: frozenset[str]


def read_mounts(text: str | None = None) -> list[Mount]:
    """The mount table (``/proc/mounts`` unless ``text``); empty where there is none."""
    if text is None:
        try:
            text = Path("/proc/mounts").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return []
    mounts = []
    for parts in (line.split() for line in text.splitlines()):
        if len(parts) >= 4:  # the kernel writes a space in a mount point as \040
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), parts[1])
            mounts.append(Mount(point, parts[2], frozenset(parts[3].split(","))))
    return mounts


def mount_of(path: Path, mounts: list[Mount]) -> Mount | None:
    """The mount holding ``path``: the longest mount point above it (the later wins a tie)."""
    p = path.expanduser().absolute()
    best: Mount | None = None
    for m in mounts:
        if (p == Path(m.point) or Path(m.point) in p.parents) and (
            best is None or len(m.point) >= len(best.point)
        ):
            best = m
    return best


def _fs_of(path: Path, mounts: list[Mount]) -> tuple[str, Mount | None]:
    """(filesystem type, mount): the mount table's type, else ``stat -f``'s."""
    m = mount_of(path, mounts)
    return (m.fstype if m else fs_type(path)), m


def lock_problem(m: Mount) -> str | None:
    """Why POSIX (fcntl) locks, SQLite's, do not work across hosts on ``m``, or None."""
    if m.fstype.startswith("nfs") and "nolock" in m.options:
        return "it is mounted 'nolock' (locks are local to each host)"
    if m.fstype.startswith("nfs") and m.options & {"local_lock=all", "local_lock=posix"}:
        return "it is mounted with 'local_lock' (POSIX locks are local to each host)"
    if m.fstype == "lustre" and "localflock" in m.options:
        return "it is mounted 'localflock' (locks are local to each client)"
    if m.fstype == "lustre" and "flock" not in m.options:
        return "it is mounted without 'flock' (lock calls fail there)"
    if m.fstype == "fuse.sshfs":
        return "sshfs has no locks shared between hosts"
    return None


def db_filesystem_check(home: Path, journal_mode: str, mounts: list[Mount]) -> Check:
    """Where the DB lives, and whether SQLite is safe there (see :data:`_DB_RULE`)."""
    db, name = home / DB_NAME, "database filesystem"
    fstype, m = _fs_of(home, mounts)
    if fstype not in _NETWORK_FS and not fstype.startswith(("nfs", "fuse.")):
        return Check(name, "ok", f"{db} is on {fstype} (not a network filesystem)")
    if journal_mode == "wal":
        why = "WAL needs memory shared by every process that opens the DB, which a network"
        return Check(
            name,
            "fail",
            f"{db} is on {fstype} with journal_mode wal: {why} filesystem lacks; set"
            " journal_mode: delete in the site file",
        )
    problem = lock_problem(m) if m is not None else "its mount options are unknown"
    if problem is None:
        return Check(name, "ok", f"{db} is on {fstype}, with working locks." + _DB_RULE)
    return Check(
        name,
        "warn",
        f"{db} is on {fstype} and {problem}: run every dlhpc command that opens the DB (cron's"
        " tick, launch, status, report) on one login node, or ask for a mount with working"
        " POSIX locks." + _DB_RULE,
    )


def checkpoint_space_check(home: Path, scratch: Path) -> Check:
    """Whether checkpoints can fill the database's filesystem (a small one shared)."""
    warning = shared_small_filesystem(home, scratch)
    if warning is not None:
        return Check("checkpoint space", "warn", warning)
    return Check("checkpoint space", "ok", f"{scratch} cannot fill a small database filesystem")


def shared_folder_checks(
    site: SiteConfig, home: Path, mounts: list[Mount], slurm: bool
) -> list[Check]:
    """With jobs on other machines (``slurm``: Slurm, or any backend that is not
    ``runs_here``), the run folders (trial.json, event files) and the checkpoint folder
    must be on a filesystem the compute nodes see: a local one is a warning."""
    checks = []
    for label, path, key in (
        ("run folders", home / "runs", "state_dir"),
        ("checkpoint folder", site.scratch.expanduser(), "scratch"),
    ):
        fstype, _ = _fs_of(path, mounts)
        local = fstype in _LOCAL_FS or fstype.startswith("ext")
        if local and slurm:
            detail = (
                f"{path} is on {fstype}, a local filesystem: jobs on other nodes cannot see it"
                f" (fine only if the compute nodes are this machine); put the site's {key} on"
                " a filesystem the compute nodes mount"
            )
            checks.append(Check(f"{label} filesystem", "warn", detail))
        else:
            checks.append(Check(f"{label} filesystem", "ok", f"{path} is on {fstype}"))
    return checks


def _quota_check(scratch: Path) -> Check:
    """The user's Lustre quota where the checkpoints go (warn at 90% of the limit)."""
    quota = lustre_quota(scratch)
    if quota is None:
        return Check("scratch quota", "skip", f"no Lustre user quota found for {scratch}")
    warning = quota_warning(scratch, quota)
    if warning:
        return Check("scratch quota", "warn", warning)
    return Check("scratch quota", "ok", f"{quota.fraction:.0%} of the limit used on {scratch}")


@click.command()
@site_option
@click.option("--json", "as_json", is_flag=True)
def doctor(site: str | None, as_json: bool) -> None:
    """Check that Slurm, accounting, partitions and folders work for this site."""
    cfg = use_site(load_site(site, backends=backends()))
    checks = run_checks(cfg)
    if as_json:
        echo_json({"site": cfg.name, "checks": [c.__dict__ for c in checks]})
    else:
        table = Table(title=f"dlhpc doctor (site {cfg.name})", title_justify="left")
        for col in ("check", "status", "detail"):
            table.add_column(col, overflow="fold")
        style = {"ok": "green", "warn": "yellow", "fail": "red", "skip": "dim"}
        for c in checks:
            table.add_row(c.name, Text(c.status, style=style[c.status]), Text(c.detail))
        console.print(table)
    if any(c.status == "fail" for c in checks):
        raise DlhpcError("doctor found problems (see the table)")


@click.group()
def db() -> None:
    """State database upkeep."""


@db.command()
@site_option
def migrate(site: str | None) -> None:
    """Back up an older state database, then bring it to this dlhpc's schema version."""
    cfg = use_site(load_site(site, backends=backends()))
    db_file = member_home(default_home(cfg.state_dir), cfg.permissions) / DB_NAME
    if not db_file.exists():
        raise UsageError(f"no state database at {db_file}")
    reader = make_engine(db_file, writer=False)
    version = read_version(reader)
    reader.dispose()
    if version == SCHEMA_VERSION:
        click.echo(f"{db_file} is at schema v{version}: nothing to do")
        return
    backup = db_file.with_name(f"{db_file.name}.v{version}.bak")
    with sqlite3.connect(db_file) as src, sqlite3.connect(backup) as dst:
        src.backup(dst)  # a consistent copy even while readers are open
    writer = make_engine(db_file, writer=True, journal_mode=cfg.journal_mode)
    try:
        start, end = run_migrations(writer)
    finally:
        writer.dispose()
    click.echo(f"{db_file}: schema v{start} -> v{end} (backup: {backup})")


@db.command("path")
@site_option
def db_path(site: str | None) -> None:
    """Print where the state database is."""
    cfg = load_site(site, backends=backends())
    click.echo(member_home(default_home(cfg.state_dir), cfg.permissions) / DB_NAME)


COMMANDS = [doctor, db]
