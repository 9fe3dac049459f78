"""Not provided by dlhpc's stand-in: importing it raises ImportError."""

from dlhpc.integrations.determined import unsupported

raise ImportError(unsupported("determined.lightning"))
