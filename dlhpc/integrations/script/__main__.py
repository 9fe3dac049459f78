"""``python -m dlhpc.integrations.script``: see :func:`dlhpc.integrations.script.main`."""

import sys

from dlhpc.integrations.script import main

sys.exit(main())
