"""``core_context.distributed`` of the stand-in: ranks of the allocation and Determined's
object collectives (``allgather``, ``gather``, ``broadcast`` and their ``_local`` forms).

With one process they are trivial; with several they use ``torch.distributed``'s object
collectives, so the script must have called ``init_process_group`` (as Determined's
``DistributedContext.from_torch_distributed()`` also needs).
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["DistributedContext"]


class DistributedContext:
    """``core_context.distributed``: ranks of this allocation, object collectives."""

    def __init__(
        self,
        *,
        rank: int,
        size: int,
        local_rank: int,
        local_size: int,
        cross_rank: int,
        cross_size: int,
        chief_ip: str | None = None,
        pub_port: int = 0,
        pull_port: int = 0,
        port_offset: int = 0,
        force_tcp: bool = False,
    ) -> None:
        self.rank, self.size = rank, size
        self.local_rank, self.local_size = local_rank, local_size
        self.cross_rank, self.cross_size = cross_rank, cross_size
        self.chief_ip = chief_ip

    @classmethod
    def from_torch_distributed(cls, chief_ip: str | None = None) -> DistributedContext:
        """From the variables torchrun (and dlhpc's worker) set."""
        env = os.environ
        size = int(env.get("WORLD_SIZE", "1"))
        local_size = int(env.get("LOCAL_WORLD_SIZE", "1"))
        return cls(
            rank=int(env.get("RANK", "0")),
            size=size,
            local_rank=int(env.get("LOCAL_RANK", "0")),
            local_size=local_size,
            cross_rank=int(env.get("GROUP_RANK", env.get("NODE_RANK", "0"))),
            cross_size=max(1, size // max(1, local_size)),
            chief_ip=chief_ip or env.get("MASTER_ADDR"),
        )

    def _torch(self) -> Any:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "dlhpc: distributed collectives with several processes need"
                " torch.distributed.init_process_group() first"
            )
        return dist

    def allgather(self, stuff: Any) -> list[Any]:
        if self.size == 1:
            return [stuff]
        out: list[Any] = [None] * self.size
        self._torch().all_gather_object(out, stuff)
        return out

    def gather(self, stuff: Any) -> list[Any] | None:
        everything = self.allgather(stuff)
        return everything if self.rank == 0 else None

    def broadcast(self, stuff: Any) -> Any:
        if self.size == 1:
            return stuff
        box = [stuff if self.rank == 0 else None]
        self._torch().broadcast_object_list(box, src=0)
        return box[0]

    def allgather_local(self, stuff: Any) -> list[Any]:
        everything = self.allgather((self.cross_rank, stuff))
        return [s for node, s in everything if node == self.cross_rank]

    def gather_local(self, stuff: Any) -> list[Any] | None:
        mine = self.allgather_local(stuff)
        return mine if self.local_rank == 0 else None

    def broadcast_local(self, stuff: Any = None) -> Any:
        everything = self.allgather((self.cross_rank, self.local_rank, stuff))
        return next(s for node, lr, s in everything if node == self.cross_rank and lr == 0)

    def close(self) -> None:
        pass
