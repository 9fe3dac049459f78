"""``dlhpc site init``: a site file written from the live Slurm cluster.

The cluster is read once (:func:`~dlhpc.scheduler.slurm.discover.read_cluster`), the
checkpoint folder candidates come from ``$SCRATCH``, ``$WORK`` and the parallel
filesystems of ``/proc/mounts`` the user may write to, and the file
(:func:`~dlhpc.scheduler.slurm.sitefile.render_site`) goes to
``~/.config/dlhpc/sites/NAME.yaml``, the user's folder on the site search path. An
existing file is replaced only with ``--force``.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import click

from dlhpc.cli._doctor import Mount, mount_of, read_mounts
from dlhpc.errors import UsageError
from dlhpc.scheduler.slurm.discover import read_cluster
from dlhpc.scheduler.slurm.sitefile import Folder, render_site

__all__ = ["COMMANDS", "scratch_candidates", "sites_folder"]

_SITE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
#: Filesystems a checkpoint folder may be on (compute nodes mount them too).
_PARALLEL_FS = ("lustre", "gpfs", "nfs", "nfs4", "beegfs")


def sites_folder() -> Path:
    """``~/.config/dlhpc/sites``, where :func:`dlhpc.config.site_search_path` looks
    for the user's sites."""
    return Path.home() / ".config" / "dlhpc" / "sites"


def _writable(path: Path) -> bool:
    return path.is_dir() and os.access(path, os.W_OK | os.X_OK)


def scratch_candidates(
    environ: Mapping[str, str], mounts: Sequence[Mount], user: str, home: Path
) -> list[Folder]:
    """Writable folders for checkpoints, the best first: ``$SCRATCH``, ``$WORK``, then
    each Lustre/GPFS/NFS mount (``MOUNT/USER`` where it exists, else the mount point)
    other than the one holding ``home`` (a small quota, not for checkpoints)."""
    found: list[Folder] = []
    for var in ("SCRATCH", "WORK"):
        value = environ.get(var, "")
        if value and _writable(Path(value)):
            found.append(Folder(Path(value), f"${var}"))
    home_mount = mount_of(home, list(mounts))
    for m in mounts:
        if m.fstype not in _PARALLEL_FS or m == home_mount:
            continue
        path = next((p for p in (Path(m.point) / user, Path(m.point)) if _writable(p)), None)
        if path is not None:
            found.append(Folder(path, f"{m.fstype} mount {m.point} in /proc/mounts"))
    unique = {f.path: f for f in reversed(found)}  # the first of each path wins
    return [f for f in found if unique[f.path] is f]


def _write(path: Path, text: str, force: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not force:
        try:
            with path.open("x", encoding="utf-8") as f:
                f.write(text)
        except FileExistsError:
            raise UsageError(_exists(path)) from None
        return
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _exists(path: Path) -> str:
    return f"{path} exists; not replaced (--force replaces it, or give another NAME)"


@click.group()
def site() -> None:
    """Site files: describe this cluster for dlhpc."""


@site.command("init")
@click.argument("name", required=False)
@click.option(
    "--partition",
    "partitions",
    multiple=True,
    help="Describe only this partition (repeat for several; default: every one).",
)
@click.option("--force", is_flag=True, help="Replace an existing site file of that name.")
def init(name: str | None, partitions: tuple[str, ...], force: bool) -> None:
    """Write ~/.config/dlhpc/sites/NAME.yaml from the live Slurm cluster (NAME: default
    its ClusterName): partitions, GPUs, accounts and limits, checkpoint folders."""
    if name is not None and not _SITE_NAME.fullmatch(name):
        raise UsageError(f"{name!r} is not a site name (letters, digits, _ . -)")
    if name is not None and (sites_folder() / f"{name}.yaml").exists() and not force:
        raise UsageError(_exists(sites_folder() / f"{name}.yaml"))
    facts = read_cluster(only=partitions)
    if name is None:
        name = facts.config.get("ClusterName", "")
        if not _SITE_NAME.fullmatch(name):
            raise UsageError(f"ClusterName {name!r} is not a site name: give NAME")
    home = Path.home()
    folders = scratch_candidates(os.environ, read_mounts(), facts.user, home)
    text = render_site(name, facts, folders)
    path = sites_folder() / f"{name}.yaml"
    _write(path, text, force)
    click.echo(f"wrote {path} ({len(facts.partitions)} partition(s))")
    for line in text.splitlines():
        if line.strip().startswith("# EDIT:"):
            click.echo(f"  {line.strip()[2:]}")
    click.echo(f"check it: dlhpc doctor --site {name}")


COMMANDS = [site]
