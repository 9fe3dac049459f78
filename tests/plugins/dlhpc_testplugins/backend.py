"""A scheduler backend defined only in the test tree, registered like a third party.

``toy`` runs its tasks through the local runner and marks them with ``TOY_JOB``;
its job environment is found by that mark. Nothing under ``dlhpc/`` names it: it
is registered as the entry point ``toy`` of group ``dlhpc.schedulers`` by this
package's ``dlhpc_testplugins-0.1.dist-info/entry_points.txt``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

from dlhpc.scheduler import JobRequest, SubmittedTask
from dlhpc.scheduler.local.environment import LocalJobEnvironment
from dlhpc.scheduler.local.scheduler import LocalScheduler
from dlhpc.scheduler.plugins import Backend, Check

__all__ = ["BACKEND", "ToyJobEnvironment", "ToyScheduler"]


class ToyScheduler(LocalScheduler):
    name = "toy"

    def _marked(self, request: JobRequest) -> JobRequest:
        return dataclasses.replace(request, env={**request.env, "TOY_JOB": request.name})

    def render(self, request: JobRequest) -> list[str]:
        return super().render(self._marked(request))

    def submit(self, request: JobRequest) -> list[SubmittedTask]:
        return super().submit(self._marked(request))


class ToyJobEnvironment(LocalJobEnvironment):
    """A toy task: the local runner's identity, found by ``TOY_JOB``."""

    name = "toy"
    marker = "TOY_JOB"
    record_vars: ClassVar[frozenset[str]] = frozenset({"TOY_JOB", "DLHPC_JOB_ID"})

    @classmethod
    def activated(cls, environ: Mapping[str, str]) -> bool:
        return bool(environ.get("TOY_JOB") and environ.get("DLHPC_JOB_ID"))


def _doctor(site: object) -> list[Check]:
    return [Check("toy", "ok", "the toy backend answers")]


def _new(root: Path) -> ToyScheduler:
    return ToyScheduler(root)


BACKEND = Backend(
    "toy",
    _new,
    environment=ToyJobEnvironment,
    doctor=_doctor,
    runs_here=True,
)
