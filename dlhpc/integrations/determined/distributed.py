"""``core_context.distributed`` of the stand-in: Determined's ``DistributedContext``, the
ranks of the trial's workers and its object collectives (``allgather``, ``gather``,
``broadcast`` and their ``_local`` forms).

As in Determined, the collectives need no training framework: each worker connects to
the chief (rank 0), which gathers every rank's object and sends the list back (Determined
does it over ZMQ; here :mod:`multiprocessing.connection`, authenticated). The chief
listens on a free port of ``chief_ip`` (``127.0.0.1`` when there is one container) and
writes its address, port and a fresh key into the attempt's folder
(:data:`RENDEZVOUS_FILE`, mode 0600); the other ranks wait for that file. The
connections are made at the first collective, which every rank must call together (as
in Determined); with one process the collectives are trivial.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path
from typing import Any

from dlhpc.protocol import ATTEMPT_DIR_VAR

__all__ = ["RENDEZVOUS_FILE", "DistributedContext"]

RENDEZVOUS_FILE = "determined-distributed.json"
CONNECT_TIMEOUT_S = 600.0  # how long a worker waits for the chief (its start may be slow)


def _rendezvous_path() -> Path:
    folder = os.environ.get(ATTEMPT_DIR_VAR)
    if not folder:
        raise RuntimeError(
            "dlhpc: DistributedContext collectives with several processes run only inside"
            " dlhpc jobs (DLHPC_ATTEMPT_DIR unset)"
        )
    return Path(folder) / RENDEZVOUS_FILE


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, readable by this user only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


class _Star:
    """The chief's connection to every other rank, or a rank's connection to the chief."""

    def __init__(self, rank: int, size: int, host: str) -> None:
        self.rank, self.size = rank, size
        self.path = _rendezvous_path()
        self.conns: list[Connection] = []
        self.listener: Listener | None = None
        if rank == 0:
            self._serve(host)
        else:
            self.conns.append(self._connect())

    def _serve(self, host: str) -> None:
        key = secrets.token_hex(32)
        self.listener = Listener((host, 0), authkey=key.encode())
        port = self.listener.address[1]
        _write_private(self.path, json.dumps({"host": host, "port": port, "key": key}))
        by_rank: dict[int, Connection] = {}
        while len(by_rank) < self.size - 1:
            conn = self.listener.accept()
            by_rank[int(conn.recv())] = conn
        self.conns = [by_rank[r] for r in sorted(by_rank)]

    def _connect(self) -> Connection:
        """Connect to the chief named in the rendezvous file, retrying until it listens
        (a file left by an earlier context names a closed port: tried again)."""
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while True:
            try:
                where = json.loads(self.path.read_text())
                conn = Client((where["host"], where["port"]), authkey=where["key"].encode())
            except (OSError, ValueError, KeyError):
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"dlhpc: rank {self.rank} found no chief to connect to in"
                        f" {CONNECT_TIMEOUT_S:g} s ({self.path})"
                    ) from None
                time.sleep(0.1)
                continue
            conn.send(self.rank)
            return conn

    def allgather(self, stuff: Any) -> list[Any]:
        if self.rank != 0:
            self.conns[0].send(stuff)
            return list(self.conns[0].recv())
        everything = [stuff, *(conn.recv() for conn in self.conns)]
        for conn in self.conns:
            conn.send(everything)
        return everything

    def close(self) -> None:
        for conn in self.conns:
            conn.close()
        if self.listener is not None:
            self.listener.close()
            self.path.unlink(missing_ok=True)


class DistributedContext:
    """``core_context.distributed``: the ranks of this trial's workers, object collectives.

    ``pub_port``, ``pull_port``, ``port_offset`` and ``force_tcp`` are accepted for
    Determined's signature; the chief picks a free port itself."""

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
        pub_port: int = 12360,
        pull_port: int = 12361,
        port_offset: int = 0,
        force_tcp: bool = False,
    ) -> None:
        self.rank, self.size = rank, size
        self.local_rank, self.local_size = local_rank, local_size
        self.cross_rank, self.cross_size = cross_rank, cross_size
        if cross_size > 1 and chief_ip is None:
            raise ValueError(
                "rank_info indicates a multi-machine environment, but chief_ip was not provided"
            )
        self._chief_ip = chief_ip if cross_size > 1 and chief_ip else "127.0.0.1"
        self._star: _Star | None = None

    @classmethod
    def _from_env(cls, names: tuple[str, ...], chief_ip: str | None) -> DistributedContext:
        """From the variables ``names`` (rank, size, local rank and size, cross rank and
        size); a missing one is that of a lone process, the cross size is derived."""
        env = os.environ
        rank, size, local_rank, local_size, cross_rank, cross_size = names
        n, per_node = int(env.get(size, "1")), int(env.get(local_size, "1"))
        return cls(
            rank=int(env.get(rank, "0")),
            size=n,
            local_rank=int(env.get(local_rank, "0")),
            local_size=per_node,
            cross_rank=int(env.get(cross_rank, "0")),
            cross_size=int(env.get(cross_size, str(max(1, n // max(1, per_node))))),
            chief_ip=chief_ip or env.get("DET_CHIEF_IP") or env.get("MASTER_ADDR"),
        )

    @classmethod
    def from_torch_distributed(cls, chief_ip: str | None = None) -> DistributedContext:
        """From the variables torchrun (and the stand-in's launch layers) set."""
        names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")
        return cls._from_env((*names, "GROUP_WORLD_SIZE"), chief_ip)

    @classmethod
    def from_deepspeed(cls, chief_ip: str | None = None) -> DistributedContext:
        """From the variables DeepSpeed's launcher (and the stand-in's) set."""
        names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE")
        return cls._from_env(names, chief_ip)

    def get_rank(self) -> int:
        return self.rank

    def get_size(self) -> int:
        return self.size

    def get_local_rank(self) -> int:
        return self.local_rank

    def get_local_size(self) -> int:
        return self.local_size

    def get_cross_rank(self) -> int:
        return self.cross_rank

    def get_cross_size(self) -> int:
        return self.cross_size

    def allgather(self, stuff: Any) -> list[Any]:
        """Every rank's ``stuff``, in rank order, on every rank."""
        if self.size == 1:
            return [stuff]
        if self._star is None:
            self._star = _Star(self.rank, self.size, self._chief_ip)
        return self._star.allgather(stuff)

    def gather(self, stuff: Any) -> list[Any] | None:
        everything = self.allgather(stuff)
        return everything if self.rank == 0 else None

    def broadcast(self, stuff: Any) -> Any:
        return self.allgather(stuff if self.rank == 0 else None)[0]

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
        if self._star is not None:
            self._star.close()
            self._star = None
