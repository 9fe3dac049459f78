"""Not provided by dlhpc's stand-in: exits 2 with the reason."""

import sys

from dlhpc.integrations.determined import unsupported

if __name__ == "__main__":
    print(unsupported("determined.launch.tensorflow"), file=sys.stderr)
    sys.exit(2)
