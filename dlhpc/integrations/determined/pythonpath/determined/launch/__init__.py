"""``determined.launch`` of dlhpc's stand-in: the launch layers a Determined entrypoint
names (``python3 -m determined.launch.torch_distributed SCRIPT...``), on
:mod:`dlhpc.integrations.determined.launch`."""
