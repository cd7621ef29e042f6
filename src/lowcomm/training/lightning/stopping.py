"""Stopping every worker at the same step boundary: on SIGINT / SIGTERM, or when a loss is not finite."""

from __future__ import annotations

import math
import signal
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Stop:
    status: str  # "interrupted" or "diverged"
    step: int  # the step after which the run stops
    ranks: tuple[int, ...]  # the ranks that received a signal / computed a non-finite loss
    signal: str | None = None  # the signal's name, when interrupted


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


def agree_on_stop(strategy, step: int, signum: int, loss: float) -> Stop | None:
    """Every rank's (signal received, loss not finite) gathered in one all-gather (Lightning's, not counted as
    training communication), so that every rank takes the same decision: a non-finite loss on any rank ->
    diverged; else a signal on any rank -> interrupted; else None."""
    local = torch.tensor([signum, 0 if math.isfinite(loss) else 1], dtype=torch.int64, device=strategy.root_device)
    gathered = strategy.all_gather(local).reshape(-1, 2).tolist()
    diverged = tuple(rank for rank, (_, bad) in enumerate(gathered) if bad)
    if diverged:
        return Stop("diverged", step, diverged)
    signalled = tuple(rank for rank, (received, _) in enumerate(gathered) if received)
    if signalled:
        return Stop("interrupted", step, signalled, signal.Signals(gathered[signalled[0]][0]).name)
    return None
