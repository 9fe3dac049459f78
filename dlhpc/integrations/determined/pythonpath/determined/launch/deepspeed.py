"""``python3 -m determined.launch.deepspeed``: see
:func:`dlhpc.integrations.determined.launch.deepspeed_main`."""

import sys

from dlhpc.integrations.determined.launch import deepspeed_main

if __name__ == "__main__":
    sys.exit(deepspeed_main(sys.argv[1:]))
