"""``python3 -m determined.launch.torch_distributed``: see
:func:`dlhpc.integrations.determined.launch.torch_distributed_main`."""

import sys

from dlhpc.integrations.determined.launch import torch_distributed_main

if __name__ == "__main__":
    sys.exit(torch_distributed_main(sys.argv[1:]))
