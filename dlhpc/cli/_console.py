"""The rich console of the commands that draw tables and live views. Apart from
``_common`` so that the commands that only print lines (``tick``, cron's command)
never import rich (its import is part of their start-up time)."""

from __future__ import annotations

import sys

from rich.console import Console

__all__ = ["console"]

# Off a terminal (pipes, cron mail, CI logs) rich would wrap at 80 columns; tables read
# better unwrapped there.
console = Console() if sys.stdout.isatty() else Console(width=200)
