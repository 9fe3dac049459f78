"""``dlhpc doctor`` (is this site usable?) and ``dlhpc db`` (schema upkeep)."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import click
from rich.table import Table
from rich.text import Text

from dlhpc.cli._common import console, echo_json, site_option
from dlhpc.config import load_site
from dlhpc.config.model import SiteConfig
from dlhpc.errors import DlhpcError, UsageError
from dlhpc.report.quota import lustre_quota, quota_warning
from dlhpc.store import default_home
from dlhpc.store._engine import SCHEMA_VERSION, make_engine, read_version
from dlhpc.store._engine import migrate as run_migrations

__all__ = ["COMMANDS"]

_NETWORK_FS = {"nfs", "nfs4", "lustre", "gpfs", "cifs", "smb2", "beegfs", "fuse.sshfs"}


@dataclass
class Check:
    name: str
    status: str  # ok, warn, fail, skip
    detail: str


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


def _slurm_checks(site: SiteConfig) -> list[Check]:
    if site.backend == "local":
        return [Check("slurm", "skip", f"site {site.name} uses the local backend")]
    if shutil.which("sbatch") is None:
        status = "fail" if site.backend == "slurm" else "skip"
        return [Check("slurm", status, "sbatch not on PATH (the local backend runs trials here)")]
    checks = []
    code, out = _run(["sinfo", "-h", "-o", "%P"])
    if code != 0:
        return [Check("slurm reachable", "fail", out.splitlines()[-1] if out else f"exit {code}")]
    parts = {p.rstrip("*") for p in out.split()}
    checks.append(Check("slurm reachable", "ok", f"partitions: {', '.join(sorted(parts))}"))
    code, out = _run(["sacct", "-n", "-X", "-P", "-S", "now-1hours", "--format=JobID"])
    if code == 0:
        checks.append(Check("accounting (sacct)", "ok", "sacct answers"))
    else:
        checks.append(
            Check("accounting (sacct)", "warn", "sacct fails; dlhpc falls back to job exit files")
        )
    wanted = set(site.partitions) | ({site.partition} if site.partition else set())
    missing = sorted(wanted - parts)
    checks.append(
        Check(
            "site partitions",
            "fail" if missing else "ok",
            f"missing on this cluster: {', '.join(missing)}" if missing else "all present",
        )
    )
    return checks


def run_checks(site: SiteConfig) -> list[Check]:
    checks = _slurm_checks(site)
    home = default_home(site.state_dir)
    for label, path in (("state folder", home), ("checkpoint folder", site.scratch.expanduser())):
        ok, detail = _writable(path)
        checks.append(Check(f"{label} writable", "ok" if ok else "fail", detail))
    checks.append(_quota_check(site.scratch.expanduser()))
    fstype = fs_type(home)
    if fstype in _NETWORK_FS:
        advice = (
            f"{home} is on {fstype}: SQLite is safe there only with one writer at a time (dlhpc's"
            " lease) and working POSIX locks; keep the journal mode 'delete' (never WAL), or put"
            " DLHPC_HOME on a login node's local disk if you always use the same login node"
        )
        checks.append(Check("database filesystem", "warn", advice))
    else:
        checks.append(Check("database filesystem", "ok", f"{home} is on {fstype}"))
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
    cfg = load_site(site)
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
    cfg = load_site(site)
    db_file = default_home(cfg.state_dir) / "dlhpc.db"
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
    click.echo(default_home(load_site(site).state_dir) / "dlhpc.db")


COMMANDS = [doctor, db]
