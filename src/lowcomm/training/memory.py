"""A run's peak memory per worker, estimated before any worker starts, against what this machine has.

peak ~ framework + P (4 + 4 + 4 s) + b T a 4  bytes (fp32), with P parameters, s optimizer-state values per parameter
(STATE_PER_PARAMETER: AdamW's two moments bound every optimizer here), b the batch per worker, T the context and
a = L (10 d + 3 h + 2 h [gated] + H T) + 4 V the activations kept for the backward pass per token (residual
stream, norms, q/k/v, attention output and probabilities, MLP hidden states; logits, their softmax and gradient).
Against the peak RSS of forward, backward and an AdamW step (one thread), it is -4 % and +14 % off for the cpu model
(batch 8 and 64 of 128 tokens) and -27 % for the smoke model (batch 32 of 64): a check for runs that cannot fit,
not a budget.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from lowcomm.config import ConfigError, RunConfig
from lowcomm.model import ModelConfig, parameter_count

FRAMEWORK_BYTES = 350 * 2**20  # a worker's Python, torch and Lightning before its first tensor
STATE_PER_PARAMETER = 2  # optimizer-state values per parameter (AdamW's m and v)
FLOAT_BYTES = 4
MEMINFO = Path("/proc/meminfo")
CGROUP = Path("/sys/fs/cgroup")  # cgroup v2: memory.max and memory.stat of this container


def activation_floats_per_token(cfg: ModelConfig, context: int) -> int:
    """a: values kept per token for the backward pass (module docstring)."""
    per_layer = 10 * cfg.d_model + (5 if cfg.mlp == "swiglu" else 3) * cfg.hidden + cfg.n_heads * context
    return cfg.n_layers * per_layer + 4 * cfg.vocab_size


def worker_peak_bytes(cfg: ModelConfig, batch_size: int, context: int) -> dict[str, int]:
    """The estimate's terms in bytes: weights, gradients and optimizer state; activations; the framework."""
    params = parameter_count(cfg)
    return {"model": params * FLOAT_BYTES * (2 + STATE_PER_PARAMETER),
            "activations": batch_size * context * activation_floats_per_token(cfg, context) * FLOAT_BYTES,
            "framework": FRAMEWORK_BYTES}


def available_bytes() -> int | None:
    """Memory this process may still use: MemAvailable, capped by a cgroup (container) limit less the cgroup's
    anonymous memory (its page cache is reclaimable, as MemAvailable counts it); None where unknown."""
    try:
        meminfo = MEMINFO.read_text()
    except OSError:
        return None
    free = next(int(line.split()[1]) * 1024 for line in meminfo.splitlines() if line.startswith("MemAvailable:"))
    try:
        limit = (CGROUP / "memory.max").read_text().strip()
        stat = dict(line.split() for line in (CGROUP / "memory.stat").read_text().splitlines())
        anon = int(stat["anon"])
    except (OSError, ValueError, KeyError):
        return free
    return free if limit == "max" else min(free, int(limit) - anon)


def size_text(n: float) -> str:
    """Bytes in GB from 1 GB on, else in MB."""
    return f"{n / 2**30:,.1f} GB" if n >= 2**30 else f"{n / 2**20:,.0f} MB"


def check_memory(cfg: RunConfig, have: int | None = None) -> None:
    """ConfigError, in one line naming data.batch_size, when the workers this node starts need more memory than it has
    (host memory on CPU, each GPU's free memory on GPU); nothing where the machine's memory is unknown."""
    t, mcfg, batch, context = cfg.train, cfg.model, cfg.data.batch_size, cfg.data.context
    need = worker_peak_bytes(mcfg, batch, context)
    on_gpu = t.accelerator in ("gpu", "cuda") or (t.accelerator == "auto" and torch.cuda.is_available())
    if on_gpu:
        workers, have = 1, have if have is not None else min(torch.cuda.mem_get_info(i)[0] for i in range(t.devices))
        need["framework"] = 0
    else:
        workers = 1 if "LOCAL_RANK" in os.environ else t.devices  # torchrun / SLURM: each process checks itself
        have = have if have is not None else available_bytes()
    total = workers * sum(need.values())
    if have is None or total <= have:
        return
    per_sequence = context * activation_floats_per_token(mcfg, context) * FLOAT_BYTES
    fits = (have // workers - need["model"] - need["framework"]) // per_sequence
    where = "each GPU" if on_gpu else f"{workers} worker(s)"
    raise ConfigError(
        f"data.batch_size={batch}: {where} need about {size_text(total)} (model {cfg.model_size}, "
        f"{parameter_count(mcfg):,} parameters: {size_text(need['model'])} of weights, gradients and optimizer state "
        f"per worker; activations of {batch} x {context} tokens {size_text(need['activations'])}), but "
        f"{size_text(have)} is available: lower data.batch_size (at most about {max(fits, 0):,} fits) or train.devices")
