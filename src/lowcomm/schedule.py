"""The learning-rate schedule of every run: linear warmup, then cosine decay."""

from __future__ import annotations

import math


def lr_lambda(warmup: int, steps: int, min_ratio: float):
    """lr(t)/lr_peak: linear warmup over `warmup` steps, then cosine from 1 to `min_ratio` at `steps`."""

    def factor(t: int) -> float:
        if t < warmup:
            return (t + 1) / warmup
        progress = min(1.0, (t - warmup) / max(1, steps - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor
