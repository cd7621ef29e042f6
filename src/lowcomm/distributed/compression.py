"""A compressed pseudo-gradient sync (SparseLoCo-style), an option of every K-step method.

Per worker m, per parameter, flattened and cut into chunks of C entries (the last one zero-padded):
    e <- beta_e e + Delta_m                          error feedback
    per chunk: the k = ceil(rho C) entries of largest |e|; their values quantized to b bits on the chunk's scale
        s = max |kept value|: q = round((v / s + 1) (2^b - 1) / 2), decoded s (2 q / (2^b - 1) - 1)
        (rounding 'nearest', or 'stochastic': floor(x + U[0, 1)) from a generator seeded per worker)
    e <- e - decoded(sent)
    Delta = mean over workers of decoded(sent_m): the messages are all-gathered and summed in rank order, the same
        order on every rank, so every replica gets bit-identical Delta (no dense all-reduce of decoded tensors).
What one message holds per chunk: k values of b bits packed into bytes (ceil(k b / 8) bytes; b = 32: fp32 values,
no scale), k indices as int16 offsets inside the chunk (none when k = C: every entry is sent in order), one fp32
scale. `message_bytes` is that formula; the Communicator's ledger counts the gathered tensors themselves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from lowcomm.distributed.comm import Communicator

BITS = (2, 4, 8, 32)
ROUNDINGS = ("nearest", "stochastic")
MAX_CHUNK = 2 ** 15  # int16 offsets


@dataclass(frozen=True)
class Compression:
    """density rho, bits b, chunk C, rounding, error-feedback decay beta_e."""

    density: float
    bits: int
    chunk: int
    rounding: str
    ef_beta: float

    @property
    def kept(self) -> int:
        """k, the entries sent per chunk."""
        return max(1, math.ceil(self.density * self.chunk))


def message_bytes(numel: int, c: Compression) -> int:
    """Bytes of one worker's message for a tensor of `numel` entries: per chunk, values + indices + scale."""
    chunks, k = math.ceil(numel / c.chunk), c.kept
    values = 4 * k if c.bits == 32 else math.ceil(k * c.bits / 8)
    indices = 0 if k == c.chunk else 2 * k
    scale = 0 if c.bits == 32 else 4
    return chunks * (values + indices + scale)


def pack(q: torch.Tensor, bits: int) -> torch.Tensor:
    """Rows of integers in [0, 2^bits) packed little-end first into uint8, 8 / bits per byte (bits 2, 4 or 8)."""
    per = 8 // bits
    width = math.ceil(q.shape[1] / per) * per
    padded = torch.zeros(q.shape[0], width, dtype=torch.uint8, device=q.device)
    padded[:, : q.shape[1]] = q.to(torch.uint8)
    shifts = torch.arange(per, dtype=torch.uint8, device=q.device) * bits
    return (padded.view(q.shape[0], -1, per) << shifts).sum(dim=2, dtype=torch.uint8)


def unpack(packed: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """The first `count` integers of each row of `pack`'s output (int64)."""
    per = 8 // bits
    shifts = torch.arange(per, dtype=torch.uint8, device=packed.device) * bits
    mask = (1 << bits) - 1
    return ((packed.unsqueeze(2) >> shifts) & mask).reshape(packed.shape[0], -1)[:, :count].long()


class ChunkCodec:
    """Encode the chunk-wise top-k of a flat tensor into (values, indices, scales) and decode it back."""

    def __init__(self, c: Compression, generator: torch.Generator):
        self.c, self.generator = c, generator

    def chunks(self, flat: torch.Tensor) -> torch.Tensor:
        rows = math.ceil(flat.numel() / self.c.chunk)
        padded = torch.zeros(rows * self.c.chunk, dtype=flat.dtype, device=flat.device)
        padded[: flat.numel()] = flat
        return padded.view(rows, self.c.chunk)

    def encode(self, flat: torch.Tensor) -> list[torch.Tensor]:
        c, k = self.c, self.c.kept
        rows = self.chunks(flat)
        index = rows.abs().topk(k, dim=1, sorted=False).indices if k < c.chunk else None
        kept = rows.gather(1, index) if index is not None else rows
        message = [] if index is None else [index.to(torch.int16)]
        if c.bits == 32:
            return [kept.float(), *message]
        scale = kept.abs().amax(dim=1, keepdim=True).float()
        levels = 2 ** c.bits - 1
        x = (kept.float() / scale.clamp_min(torch.finfo(torch.float32).tiny) + 1) * levels / 2
        if c.rounding == "stochastic":
            x = x + torch.rand(x.shape, generator=self.generator).to(x.device)
            q = x.floor().clamp(0, levels)
        else:
            q = x.round().clamp(0, levels)
        return [pack(q, c.bits), *message, scale]

    def decode(self, message: list[torch.Tensor], numel: int, dtype: torch.dtype) -> torch.Tensor:
        c, k = self.c, self.c.kept
        rows = math.ceil(numel / c.chunk)
        if c.bits == 32:
            values = message[0]
        else:
            levels = 2 ** c.bits - 1
            values = message[-1] * (2 * unpack(message[0], c.bits, k).float() / levels - 1)
        dense = torch.zeros(rows, c.chunk, dtype=dtype, device=message[0].device)
        if k < c.chunk:
            dense.scatter_(1, message[1].long(), values.to(dtype))
        else:
            dense.copy_(values.view(rows, c.chunk))
        return dense.view(-1)[:numel]


class CompressedPseudoGradient:
    """Delta = mean_m decoded(compress(e_m)) with per-worker error feedback e_m (the module docstring)."""

    def __init__(self, params: list[torch.nn.Parameter], comm: Communicator, c: Compression, seed: int = 0):
        self.comm, self.c = comm, c
        self.errors = [torch.zeros_like(p, memory_format=torch.contiguous_format) for p in params]
        generator = torch.Generator().manual_seed(seed * 1_000_003 + comm.rank)
        self.codec = ChunkCodec(c, generator)

    @torch.no_grad()
    def __call__(self, deltas: list[torch.Tensor]) -> list[torch.Tensor]:
        """The aggregated Delta of each parameter from this worker's local deltas (identical on every rank)."""
        out = []
        for e, d in zip(self.errors, deltas):
            e.mul_(self.c.ef_beta).add_(d)
            message = self.codec.encode(e.view(-1))
            e.sub_(self.codec.decode(message, e.numel(), e.dtype).view_as(e))
            gathered = [[g.view(part.dtype) for g in self.comm.all_gather(part.view(torch.uint8), "pseudo_gradient")]
                        for part in message]  # as raw bytes: gloo gathers no int16
            total = torch.zeros(e.numel(), dtype=e.dtype, device=e.device)
            for rank in range(self.comm.world_size):
                total += self.codec.decode([parts[rank] for parts in gathered], e.numel(), e.dtype)
            out.append(total.div_(self.comm.world_size).view_as(d))
        return out

    def state_bytes(self) -> int:
        return sum(e.numel() * e.element_size() for e in self.errors)
