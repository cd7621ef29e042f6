"""What an optimizer that synchronizes itself needs from the process group: an averaging all-reduce whose bytes
are booked under a kind (lowcomm.distributed.comm.Communicator is one)."""

from __future__ import annotations

from typing import Protocol

from torch import Tensor


class AllReduce(Protocol):
    world_size: int

    def all_reduce(self, tensors: Tensor | list[Tensor], kind: str, op: str = "mean") -> None:
        """Reduce `tensors` in place over the group (op "mean" or "sum"), booking their bytes under `kind`."""
