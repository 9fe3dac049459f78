"""``python3 -m determined.launch.wrap_rank``: see
:func:`dlhpc.integrations.determined.launch.wrap_rank_main`."""

import sys

from dlhpc.integrations.determined.launch import wrap_rank_main

if __name__ == "__main__":
    sys.exit(wrap_rank_main(sys.argv[1:]))
