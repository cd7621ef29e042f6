"""Compute efficiency of a training step: achieved FLOP/s as a share of the machine's measured matmul peak.

- peak: a large fp32 matmul (n x n by n x n, 2 n^3 FLOPs), same threads, median of repeats;
- step: forward, backward and AdamW step of the cpu model on one batch in one process, eager and with
  torch.compile of the loss (`train.compile=true`), median of repeats after warm-up steps;
- FLOPs per step = tokens x (6 N + 12 L d T): N the parameters that enter a matmul (hidden matrices and the output
  head; not the embedding lookup), L layers, d width, T context (the attention scores and values, forward and
  backward, counted in full as is the convention).
Writes results/bench/flops.csv.

    .venv/bin/python benchmarks/bench_flops.py [--threads 2 --size cpu --batch 8 --context 128]
"""

from __future__ import annotations

import argparse
import time

import torch
from common import machine, median, write_csv

from lowcomm.model import Transformer, model_config
from lowcomm.optim import build_optimizer


def matmul_peak(n: int, repeats: int) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        torch.mm(a, b)
        times.append(time.perf_counter() - start)
    return 2 * n ** 3 / median(times[1:])


def step_flops(model: Transformer, tokens: int, context: int) -> float:
    cfg = model.cfg
    head = model.embed.weight if model.lm_head is None else model.lm_head.weight
    matmul_params = sum(p.numel() for _, p in model.hidden_matrices()) + head.numel()
    return tokens * (6 * matmul_params + 12 * cfg.n_layers * cfg.d_model * context)


def step_time(size: str, batch: int, context: int, compiled: bool, warmup: int, repeats: int) -> tuple[float, float]:
    """(median seconds per training step, FLOPs per step)."""
    torch.manual_seed(0)
    model = Transformer(model_config(size, max_context=context))
    optimizer = build_optimizer({"name": "adamw", "lr": 1e-3}, model)
    loss_fn = torch.compile(model.loss) if compiled else model.loss
    x = torch.randint(0, model.cfg.vocab_size, (batch, context))
    y = torch.randint(0, model.cfg.vocab_size, (batch, context))
    times = []
    for i in range(warmup + repeats):
        start = time.perf_counter()
        loss_fn(x, y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return median(times), step_flops(model, batch * context, context)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--size", default="cpu")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--matmul", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    peak = matmul_peak(args.matmul, 10)
    rows = []
    for compiled in (False, True):
        seconds, flops = step_time(args.size, args.batch, args.context, compiled, warmup=5, repeats=args.repeats)
        rows.append({"size": args.size, "batch": args.batch, "context": args.context, "compiled": compiled,
                     "step_s": round(seconds, 5), "flops_per_step": flops, "achieved_gflops": round(flops / seconds / 1e9, 2),
                     "peak_gflops": round(peak / 1e9, 2), "share_of_peak": round(flops / seconds / peak, 4)})
        print(f"{'compiled' if compiled else 'eager':8s}: {seconds * 1e3:.1f} ms/step, {flops / seconds / 1e9:.1f} "
              f"GFLOP/s = {flops / seconds / peak:.1%} of the {peak / 1e9:.1f} GFLOP/s matmul peak", flush=True)
    print(f"wrote {write_csv('flops', [{**r, **machine(args.threads)} for r in rows]).name}")


if __name__ == "__main__":
    main()
