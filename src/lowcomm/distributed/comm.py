"""Communicator: the only caller of torch.distributed collectives; it keeps a ledger of bytes by kind and step.

Payload = bytes of the tensor handed to a collective. Bytes on the wire per worker (bandwidth-optimal
algorithms): all-reduce (ring) 2(M-1)/M x payload; all-gather and broadcast (M-1)/M x (M x payload) = (M-1) x payload
for all-gather, (M-1)/M x payload for a pipelined broadcast. With M = 1 nothing is sent and no process group is needed.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch
import torch.distributed as dist

def flatten(tensors: list[torch.Tensor]) -> torch.Tensor:
    """One buffer for one collective: the tensors' entries end to end (the tensor itself when there is one)."""
    return tensors[0] if len(tensors) == 1 else torch.cat([t.reshape(-1) for t in tensors])


def copy_back(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    """The inverse of `flatten`, in place: each tensor <- its slice of `flat`."""
    if len(tensors) > 1:
        for t, piece in zip(tensors, flat.split([t.numel() for t in tensors])):
            t.copy_(piece.view_as(t))


KINDS = ("gradient", "projected_gradient", "pseudo_gradient", "optimizer_state", "basis", "factor", "parameters",
         "probe")


def wire_bytes(collective: str, payload: int, world_size: int) -> float:
    """Bytes one worker sends for a collective of `payload` bytes among `world_size` workers."""
    m = world_size
    if collective == "all_reduce":
        return 2 * (m - 1) / m * payload
    if collective == "all_gather":
        return (m - 1) * payload
    if collective == "broadcast":
        return (m - 1) / m * payload
    raise ValueError(f"unknown collective {collective!r}")


@dataclass(frozen=True)
class Record:
    step: int
    kind: str
    collective: str
    payload: int
    wire: float


class Communicator:
    """Collectives over `group` (None: the default group, or a single process when torch.distributed is
    not initialized). Every call names a `kind` from KINDS and is recorded at the current `step`."""

    def __init__(self, group: dist.ProcessGroup | None = None):
        self.group = group
        self.distributed = dist.is_available() and dist.is_initialized()
        self.world_size = dist.get_world_size(group) if self.distributed else 1
        self.rank = dist.get_rank(group) if self.distributed else 0
        self.step = 0
        self.records: list[Record] = []
        self._wire_by_step: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self._wire_by_kind: dict[str, float] = defaultdict(float)

    def _record(self, kind: str, collective: str, tensors: list[torch.Tensor]) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown communication kind {kind!r}: use one of {KINDS}")
        payload = sum(t.numel() * t.element_size() for t in tensors)
        record = Record(self.step, kind, collective, payload, wire_bytes(collective, payload, self.world_size))
        self.records.append(record)
        self._wire_by_step[record.step][kind] += record.wire
        self._wire_by_kind[kind] += record.wire

    def all_reduce(self, tensors: torch.Tensor | list[torch.Tensor], kind: str, op: str = "mean") -> None:
        """In place: each tensor <- sum or mean over workers; a list is sent as one flat buffer."""
        if op not in ("mean", "sum"):
            raise ValueError(f"all_reduce op={op!r}: use 'mean' or 'sum'")
        tensors = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
        if not tensors:
            return
        self._record(kind, "all_reduce", tensors)
        if self.world_size == 1:
            return
        flat = flatten(tensors)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group)
        if op == "mean":
            flat.div_(self.world_size)
        copy_back(flat, tensors)

    def broadcast(self, tensors: torch.Tensor | list[torch.Tensor], kind: str, src: int = 0) -> None:
        """In place: every worker's tensors <- those of rank `src`."""
        tensors = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
        if not tensors:
            return
        self._record(kind, "broadcast", tensors)
        if self.world_size == 1:
            return
        flat = flatten(tensors)
        dist.broadcast(flat, src=dist.get_global_rank(self.group, src) if self.group else src, group=self.group)
        copy_back(flat, tensors)

    def all_gather(self, tensor: torch.Tensor, kind: str) -> list[torch.Tensor]:
        """Every worker's `tensor`, in rank order."""
        self._record(kind, "all_gather", [tensor])
        if self.world_size == 1:
            return [tensor.clone()]
        out = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(out, tensor.contiguous(), group=self.group)
        return out

    def wire_bytes_by_kind(self) -> dict[str, float]:
        """Total bytes this worker put on the wire, by kind."""
        return dict(self._wire_by_kind)

    def payload_bytes_by_kind(self) -> dict[str, int]:
        totals: dict[str, int] = defaultdict(int)
        for r in self.records:
            totals[r.kind] += r.payload
        return dict(totals)

    def wire_bytes_at(self, step: int) -> dict[str, float]:
        """Bytes on the wire at one step, by kind (constant time: kept as the collectives are recorded)."""
        return dict(self._wire_by_step.get(step, {}))

    def wire_bytes_by_step(self) -> dict[int, dict[str, float]]:
        """Bytes on the wire at every step that communicated: {step: {kind: bytes}}."""
        return {step: dict(kinds) for step, kinds in sorted(self._wire_by_step.items())}
