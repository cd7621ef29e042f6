"""Stopping every worker at the same step boundary: on SIGINT / SIGTERM, when a loss is not finite, or when a write
failed for lack of disk space."""

from __future__ import annotations

import math
import signal
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Stop:
    status: str  # "interrupted", "diverged" or "failed" (a write failed for lack of space)
    step: int  # the step after which the run stops
    ranks: tuple[int, ...]  # the ranks that received a signal / computed a non-finite loss / could not write
    signal: str | None = None  # the signal's name, when interrupted
    needed: tuple[int, ...] = ()  # per rank of `ranks`, the bytes its failed write needed


class SignalFlag:
    """Notes the first SIGINT / SIGTERM this process receives instead of raising; the run acts on it at the
    next step boundary."""

    def __init__(self):
        self.signum = 0
        self.previous: dict = {}

    def install(self) -> None:
        self.previous = {s: signal.signal(s, self._note) for s in (signal.SIGINT, signal.SIGTERM)}

    def restore(self) -> None:
        """The handlers from before `install` (a run inside this process leaves Ctrl-C as it found it)."""
        for s, handler in self.previous.items():
            signal.signal(s, handler)
        self.previous = {}

    def _note(self, signum, frame) -> None:
        self.signum = self.signum or signum


def agree_on_stop(strategy, step: int, signum: int, loss: float, no_space_bytes: int = 0) -> Stop | None:
    """Every rank's (signal received, loss not finite, bytes of a write that failed for lack of space) gathered in one
    all-gather (Lightning's, not counted as training communication), so that every rank takes the same decision: a
    non-finite loss on any rank -> diverged; else a failed write -> failed; else a signal -> interrupted; else None."""
    local = torch.tensor([signum, 0 if math.isfinite(loss) else 1, no_space_bytes], dtype=torch.int64,
                         device=strategy.root_device)
    gathered = strategy.all_gather(local).reshape(-1, 3).tolist()
    diverged = tuple(rank for rank, (_, bad, _) in enumerate(gathered) if bad)
    if diverged:
        return Stop("diverged", step, diverged)
    full = tuple(rank for rank, (_, _, needed) in enumerate(gathered) if needed)
    if full:
        return Stop("failed", step, full, needed=tuple(gathered[rank][2] for rank in full))
    signalled = tuple(rank for rank, (received, _, _) in enumerate(gathered) if received)
    if signalled:
        return Stop("interrupted", step, signalled, signal.Signals(gathered[signalled[0]][0]).name)
    return None
