"""``python -m dlhpc`` is the ``dlhpc`` command."""

from dlhpc.cli.main import main

main()
