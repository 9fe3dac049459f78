"""``dlhpc cron``: the crontab line that keeps experiments moving; ``dlhpc digest``.

The line runs this interpreter (``sys.executable -m dlhpc``, so the venv need not be
activated) with ``PATH``, ``SLURM_CONF``, ``DLHPC_HOME``, ``DLHPC_SITE`` (and
``DLHPC_SITE_PATH``) fixed to what they resolve to now, each value shell-quoted and with
``%`` escaped (cron turns a bare ``%`` into a newline). It is quiet unless something needs
attention, since cron mails any output: ``tick -q`` prints only errors, failed trials and
newly idle GPUs, and ``report -q`` only errors. A run that starts while another still
ticks finds the reconciler lease taken and its tick exits quietly.

``--notify`` adds ``dlhpc digest``: finished experiments, failed trials and idle GPUs
since the digest's last run (its mark lives in ``$DLHPC_HOME/cron/``), appended to a file
or piped to ``mail -s SUBJECT ADDRESS``. Nothing new: no digest at all.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import click

from dlhpc._perms import member_home
from dlhpc.cli import _attention as att
from dlhpc.cli._common import backends, open_store, site_option
from dlhpc.config import load_site
from dlhpc.report.publish import check_publishable
from dlhpc.store import Store, default_home

__all__ = ["COMMANDS", "cron_line", "scrontab_entry"]

_FIRST_DIGEST = timedelta(hours=24)  # a first digest looks back this far
_MAIL_TIMEOUT_S = 120


def _schedule(every: int) -> str:
    if 1 <= every < 60:
        return "* * * * *" if every == 1 else f"*/{every} * * * *"
    if every % 60 == 0 and 60 <= every <= 1440:
        hours = every // 60
        return "0 0 * * *" if hours == 24 else "0 * * * *" if hours == 1 else f"0 */{hours} * * *"
    raise click.BadParameter(
        "minutes 1-59, or whole hours (60, 120, ... 1440)", param_hint="--every"
    )


def _cron_quote(value: str, what: str) -> str:
    """Quote for /bin/sh, with every ``%`` written ``\\%`` outside the quotes: cron ends the
    command at a bare ``%`` and turns ``\\%`` into ``%``. (``shlex.quote`` of a piece never
    ends in a backslash, which would otherwise escape the escape.)"""
    if "\n" in value or "\r" in value:
        raise click.BadParameter(f"{what} contains a newline, which a crontab line cannot hold")
    return "\\%".join(shlex.quote(piece) for piece in value.split("%"))


def _path(python: str) -> str:
    """This venv's bin first, then today's PATH (absolute entries only: cron starts in $HOME)."""
    entries = [os.path.dirname(python), *os.environ.get("PATH", "").split(os.pathsep)]
    keep = [e for e in dict.fromkeys(entries) if os.path.isabs(e)]
    return os.pathsep.join(keep or ["/usr/local/bin", "/usr/bin", "/bin"])


def _notify_target(notify: str) -> str:
    """``mail:ADDRESS`` as given (``mail`` must exist), else an absolute file path."""
    if notify.startswith("mail:"):
        address = notify[len("mail:") :]
        if not address or any(c.isspace() for c in address):
            raise click.BadParameter("mail:ADDRESS needs one address", param_hint="--notify")
        if shutil.which("mail") is None:
            raise click.BadParameter(
                "there is no `mail` command here (install bsd-mailx or mailutils, or ask your "
                "site how mail leaves the login node); use --notify FILE instead",
                param_hint="--notify",
            )
        return notify
    return str(Path(notify).expanduser().absolute())


def cron_line(
    site: str | None = None,
    every: int = 1,
    out_dir: Path | None = None,
    notify: str | None = None,
    publish: bool = False,
) -> tuple[str, dict[str, str]]:
    """The crontab line, and the environment it fixes (name -> value, unquoted).
    ``publish``: the report runs with ``--publish`` (its folder checked here first)."""
    cfg = load_site(site, backends=backends())
    home = default_home(cfg.state_dir)
    python = os.path.abspath(sys.executable)
    env = {"PATH": _path(python)}
    slurm_conf = os.environ.get("SLURM_CONF") or cfg.env.get("SLURM_CONF")
    if slurm_conf:
        env["SLURM_CONF"] = slurm_conf
    env["DLHPC_HOME"] = str(home)
    env["DLHPC_SITE"] = str(cfg.source.absolute()) if cfg.source else cfg.name
    if os.environ.get("DLHPC_SITE_PATH"):
        env["DLHPC_SITE_PATH"] = os.environ["DLHPC_SITE_PATH"]
    mine = member_home(home, cfg.permissions)  # group mode: your folder in the lab's
    reports = (out_dir or mine / "reports").expanduser().absolute()
    if publish:
        check_publishable(reports, home)
    exports = " ".join(f"{k}={_cron_quote(v, k)}" for k, v in env.items())
    dlhpc = f"{_cron_quote(python, 'the python path')} -m dlhpc"
    command = (
        f"export {exports}; {dlhpc} tick -q && "
        f"{dlhpc} report --all --out-dir {_cron_quote(str(reports), '--out-dir')} -q"
    ) + (" --publish" if publish else "")
    if notify:
        command += f"; {dlhpc} digest --notify {_cron_quote(_notify_target(notify), '--notify')}"
    return f"{_schedule(every)} {command}", env


def scrontab_entry(
    site: str | None = None,
    every: int = 1,
    out_dir: Path | None = None,
    notify: str | None = None,
    time_limit: str = "00:10:00",
    publish: bool = False,
) -> tuple[str, dict[str, str]]:
    """The scrontab entry (``#SCRON`` option lines, then :func:`cron_line`'s line) for
    clusters without cron on the login node, and the environment it fixes. Slurm runs
    it as a job of its own that is queued again for its next time, so two runs never
    overlap (and a tick that finds the lease taken exits quietly, as from cron). It
    takes the site's partition, account and QOS; its log is appended to
    ``$DLHPC_HOME/cron/scrontab.log``."""
    line, env = cron_line(site, every, out_dir, notify, publish)
    cfg = load_site(site, backends=backends())
    options = {
        "job-name": "dlhpc-tick",
        "partition": (cfg.partition or "").split(",")[0] or None,
        "account": cfg.account,
        "qos": cfg.qos,
        "time": time_limit,
        "cpus-per-task": "1",
        "output": str(Path(env["DLHPC_HOME"]) / "cron" / "scrontab.log"),
        "open-mode": "append",
    }
    head = []
    for key, value in options.items():
        if value is not None:
            if any(c.isspace() for c in value):
                raise click.BadParameter(f"the scrontab option --{key} {value!r} holds a space")
            head.append(f"#SCRON --{key}={value}")
    return "\n".join([*head, line]), env


@click.command()
@site_option
@click.option(
    "--every", default=1, show_default=True, help="Minutes between runs (or whole hours)."
)
@click.option(
    "--out-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where `dlhpc report --all` writes the pages (default: $DLHPC_HOME/reports; group"
    " mode: $DLHPC_HOME/users/<you>/reports).",
)
@click.option(
    "--notify",
    default=None,
    metavar="FILE|mail:ADDRESS",
    help="Also send a digest (finished experiments, failed trials, idle GPUs) of what is new.",
)
@click.option(
    "--scrontab",
    is_flag=True,
    help="Print a Slurm scrontab entry instead (install it with `scrontab FILE`).",
)
@click.option(
    "--time",
    "time_limit",
    default="00:10:00",
    show_default=True,
    help="With --scrontab: the tick job's time limit.",
)
@click.option(
    "--publish", is_flag=True, help="The reports readable by others (`report --publish`)."
)
def cron(
    site: str | None,
    every: int,
    out_dir: Path | None,
    notify: str | None,
    scrontab: bool,
    time_limit: str,
    publish: bool,
) -> None:
    """Print the crontab line for this user and site (install it with `crontab -e`).

    With --scrontab: the Slurm scrontab entry instead, for clusters without cron on the
    login node (install it with `scrontab FILE`)."""
    if scrontab:
        entry, env = scrontab_entry(site, every, out_dir, notify, time_limit, publish)
        # Slurm does not create a log's folder: a job whose --output it cannot open fails
        (Path(env["DLHPC_HOME"]) / "cron").mkdir(parents=True, exist_ok=True)
        click.echo(
            f"# dlhpc: tick every {every} min and refresh the reports, as a Slurm scrontab\n"
            "# job (runs never overlap). Save this to a file and run `scrontab FILE` (that\n"
            "# replaces your scrontab: merge it with `scrontab -l` first); state in\n"
            f"# {env['DLHPC_HOME']}, site {env['DLHPC_SITE']}."
        )
        click.echo(entry)
        return
    line, env = cron_line(site, every, out_dir, notify, publish)
    click.echo(
        f"# dlhpc: tick every {every} min and refresh the reports; prints (and cron mails)\n"
        "# only what needs attention. Add it with `crontab -e`; it fixes the environment\n"
        f"# to today's: state in {env['DLHPC_HOME']}, site {env['DLHPC_SITE']}."
    )
    click.echo(line)


# ------------------------------------------------------------------------- digest


def _mark_file(store: Store, target: str) -> Path:
    slug = hashlib.sha256(target.encode()).hexdigest()[:12]
    return att.state_dir(store) / f"digest-{slug}.json"


def digest_text(a: att.Attention, since: datetime, until: datetime, home: Path) -> str:
    lines = [f"dlhpc digest {until:%Y-%m-%d %H:%M} UTC (since {since:%Y-%m-%d %H:%M}), {home}"]
    for e in a.finished:
        best = "" if e["best"] is None else f", best {e['metric']}={e['best']:.4g}"
        best += "" if e["best_trial"] is None else f" (trial {e['best_trial']})"
        hours = f"{e['gpu_hours']:.2f} GPU-h" if e["gpu_hours"] else f"{e['cpu_hours']:.2f} CPU-h"
        lines.append(
            f"finished: experiment {e['id']} {e['name']} {e['state']}: {e['trials']} trials"
            f" ({e['failed_trials']} failed){best}, {hours}"
        )
    lines += [f"failed: {att.failed_line(t)}" for t in a.failed]
    lines += [att.idle_line(g) for g in a.idle]
    return "\n".join(lines) + "\n"


def _subject(a: att.Attention) -> str:
    parts = [
        f"{len(a.finished)} finished" if a.finished else "",
        f"{len(a.failed)} trial(s) failed" if a.failed else "",
        f"{len(a.idle)} GPU(s) idle" if a.idle else "",
    ]
    return "dlhpc: " + ", ".join(p for p in parts if p)


def _deliver(text: str, subject: str, target: str | None) -> None:
    if target is None:
        click.echo(text, nl=False)
    elif target.startswith("mail:"):
        mail = shutil.which("mail")
        if mail is None:  # removed since `dlhpc cron`: cron mails stdout instead
            click.echo("warning: no `mail` command; the digest follows", err=True)
            click.echo(text, nl=False)
            return
        try:
            proc = subprocess.run(
                [mail, "-s", subject, target[len("mail:") :]],
                input=text,
                text=True,
                capture_output=True,
                timeout=_MAIL_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise click.ClickException(f"mail did not finish in {_MAIL_TIMEOUT_S} s") from None
        if proc.returncode != 0:
            why = (proc.stderr or proc.stdout).strip() or f"exit code {proc.returncode}"
            raise click.ClickException(f"mail failed ({why}); the digest is kept for next time")
    else:
        path = Path(target)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as f:
            f.write(text + "\n")
            f.flush()
            os.fsync(f.fileno())


@click.command()
@site_option
@click.option(
    "--notify",
    default=None,
    metavar="FILE|mail:ADDRESS",
    help="Append the digest to FILE or mail it (default: print it).",
)
def digest(site: str | None, notify: str | None) -> None:
    """What is new since the last digest to the same place: finished experiments, failed
    trials, idle GPUs (each idle spell once); a first digest looks back 24 hours. Nothing
    new: no output. Without ``mail`` on PATH a mail: digest is printed instead (for cron to
    mail); when ``mail`` fails, the digest is kept for the next run."""
    store = open_store(site)
    target = None if notify is None else _notify_target_run(notify)
    mark = _mark_file(store, target or "-")
    mark.parent.mkdir(parents=True, exist_ok=True)
    with (mark.parent / ".digest.lock").open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # another digest runs (an overlapping cron run): it says it all
        state = att.read_json(mark)
        until = att.utcnow()
        try:
            since = datetime.fromisoformat(state["until"])
        except (KeyError, TypeError, ValueError):
            since = until - _FIRST_DIGEST
        found = att.collect(store, since, until)
        said = set(state.get("idle_said", []))
        idle_now = {att.idle_key(g): g for g in found.idle}
        found.idle = [g for k, g in idle_now.items() if k not in said]
        if found:
            _deliver(digest_text(found, since, until, store.home), _subject(found), target)
        att.atomic_write_json(
            mark,
            {"target": target or "-", "until": until.isoformat(), "idle_said": sorted(idle_now)},
        )


def _notify_target_run(notify: str) -> str:
    """At run time a missing ``mail`` is no error (see :func:`_deliver`)."""
    if notify.startswith("mail:"):
        if not notify[len("mail:") :]:
            raise click.BadParameter("mail:ADDRESS needs an address", param_hint="--notify")
        return notify
    return str(Path(notify).expanduser().absolute())


COMMANDS = [cron, digest]
