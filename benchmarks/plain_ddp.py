"""Anchor for the harness benchmark: a plain torch.distributed script, `--workers` gloo processes, the model wrapped in
DistributedDataParallel, over the model, data, optimizer and schedule that `lowcomm.train` uses with method=ddp.
Rank 0 prints one JSON line.

    .venv/bin/python benchmarks/plain_ddp.py --steps 200 --workers 4
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from lowcomm.data import PackedSequences, ShardSampler, offline_streams
from lowcomm.model import Transformer, model_config
from lowcomm.optim import build_optimizer
from lowcomm.schedule import lr_lambda


def worker(rank: int, args: argparse.Namespace, port: int) -> None:
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.workers)
    torch.manual_seed(0)
    train, val, _ = offline_streams(4096)
    model = DistributedDataParallel(Transformer(model_config(args.size, max_context=args.context)))
    optimizer = build_optimizer({"name": "adamw", "lr": args.lr}, model.module)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(args.steps // 8, args.steps, 0.1))
    data = PackedSequences(train, args.context)
    loader = DataLoader(data, args.batch, sampler=ShardSampler(len(data), rank, args.workers, seed=0), drop_last=True)
    x_val, y_val = next(iter(DataLoader(PackedSequences(val, args.context), args.batch)))
    start = time.perf_counter()
    for step, (x, y) in enumerate(loader, start=1):
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())  # Transformer.loss via DDP
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        schedule.step()
        if step == args.steps:
            break
    train_s = time.perf_counter() - start
    with torch.no_grad():
        val_loss = float(model.module.loss(x_val, y_val))
    if rank == 0:
        tokens = args.steps * args.batch * args.context * args.workers
        print(json.dumps({"steps": args.steps, "train_s": train_s, "loss": float(loss.detach()), "val_loss": val_loss,
                          "tokens_per_s": tokens / train_s}), flush=True)
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="cpu")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--lr", type=float, default=3e-3)
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    mp.spawn(worker, args=(args, free_port()), nprocs=args.workers, join=True)


if __name__ == "__main__":
    main()
