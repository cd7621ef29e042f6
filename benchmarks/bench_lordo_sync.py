"""Cost of LoRDO's synchronization at the lordo-16m size, on real gloo workers (one thread each).

A sync at t % K == 0 is: the pseudo-gradient all-reduce, the outer step, the new global basis from the averaged
pseudo-gradient (exact SVD or the randomized range finder, `optim.basis_method`), the rotation of the low-rank
moments into it, and the moment averaging. Its cost is the time of `engine.after_optimizer_step` at a sync step
less that at a local step (medians over syncs; the workers meet at a barrier before each, so a rank's wait for
slower local steps elsewhere is not counted); amortized, cost / K as a share of a training step (forward, backward
and local optimizer step of lordo-16m at the given batch and context). Writes results/bench/lordo_sync.csv.

    .venv/bin/python benchmarks/bench_lordo_sync.py [--workers 2 --batch 4 --context 256 --syncs 3]
"""

from __future__ import annotations

import argparse
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from common import machine, median, write_csv

from lowcomm.config import method_preset
from lowcomm.distributed.comm import Communicator
from lowcomm.distributed.options import sync_options
from lowcomm.distributed.sync import build_sync_engine
from lowcomm.model import Transformer, model_config
from lowcomm.optim import build_optimizer

SIZE = "lordo-16m"


def build(basis_method: str, sync_every: int):
    torch.manual_seed(0)
    preset = method_preset("lordo")
    model = Transformer(model_config(SIZE, max_context=512))
    optimizer = build_optimizer({**preset.optim, "lr": 1e-3, "basis_method": basis_method}, model)
    engine = build_sync_engine(sync_options({**preset.sync, "sync_every": sync_every}), model, optimizer,
                               Communicator())
    engine.setup()
    return model, optimizer, engine


def training_step_s(batch: int, context: int, repeats: int = 3) -> float:
    model, optimizer, engine = build("svd", 10 ** 6)
    x = torch.randint(0, model.cfg.vocab_size, (batch, context))
    times = []
    for step in range(1, repeats + 2):
        start = time.perf_counter()
        model.loss(x, x).backward()
        engine.before_optimizer_step(step)
        optimizer.step()
        engine.after_optimizer_step(step)
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    return median(times[1:])


def sync_cost_s(basis_method: str, k: int, syncs: int) -> tuple[float, float]:
    """(median after_optimizer_step time at sync steps, at local steps), random gradients."""
    model, optimizer, engine = build(basis_method, k)
    at_sync, local = [], []
    for step in range(1, syncs * k + 1):
        for p in model.parameters():
            p.grad = torch.randn_like(p) * 1e-3
        engine.before_optimizer_step(step)
        optimizer.step()
        dist.barrier()  # a rank that arrives first would otherwise time its wait for the others' local steps
        start = time.perf_counter()
        engine.after_optimizer_step(step)
        (at_sync if step % k == 0 else local).append(time.perf_counter() - start)
    return median(at_sync), median(local)


def worker(rank: int, args, port: int, queue) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.workers)
    step_s = training_step_s(args.batch, args.context)
    rows = []
    for basis_method in ("svd", "randomized"):
        for k in (8, 32, 64):
            sync_s, local_s = sync_cost_s(basis_method, k, args.syncs)
            cost = sync_s - local_s
            rows.append({"size": SIZE, "workers": args.workers, "basis_method": basis_method, "K": k,
                         "sync_s": round(cost, 4), "local_after_step_s": round(local_s, 5),
                         "training_step_s": round(step_s, 4), "amortized_share": round(cost / k / step_s, 4)})
            if rank == 0:
                print(f"{basis_method:10s} K={k:2d}: sync {cost * 1e3:7.1f} ms, amortized {cost / k * 1e3:6.2f} ms per "
                      f"step = {cost / k / step_s:.2%} of a {step_s * 1e3:.0f} ms training step", flush=True)
    if rank == 0:
        queue.put(rows)
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--syncs", type=int, default=3)
    args = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    queue = mp.get_context("spawn").SimpleQueue()
    mp.spawn(worker, args=(args, port, queue), nprocs=args.workers, join=True)
    rows = queue.get()
    print(f"wrote {write_csv('lordo_sync', [{**r, **machine(1)} for r in rows]).name}")


if __name__ == "__main__":
    main()
