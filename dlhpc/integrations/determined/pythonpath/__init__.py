"""Not imported as part of dlhpc: this folder is what the launcher
(``python -m dlhpc.integrations.determined``) puts first on ``PYTHONPATH``, so that its
``determined`` package is the stand-in for Determined's. The ``__init__`` only makes
packaging tools ship the folder."""
