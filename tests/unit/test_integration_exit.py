"""The adapters' exit handler: torch's default process group is destroyed while the
interpreter is still alive (a gloo group left to finalization can abort the rank)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

SCRIPT = textwrap.dedent(
    """
    import atexit, sys
    import torch.distributed as dist
    from dlhpc.integrations._common import destroy_process_group_at_exit

    # registered first, so it runs after the handler under test (atexit is LIFO)
    atexit.register(lambda: print("initialized at exit:", dist.is_initialized()))
    dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
    destroy_process_group_at_exit()
    destroy_process_group_at_exit()  # a second call is harmless
    """
)


def test_default_group_is_destroyed_at_exit(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text(SCRIPT)
    out = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "store")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert "initialized at exit: False" in out, out
