"""Anchor for the harness benchmark: a plain torch.distributed script, `--workers` gloo processes, the model wrapped in
DistributedDataParallel, over the model, data, optimizer and schedule that `lowcomm.training.train` uses with method=ddp.
Rank 0 prints one JSON line.

    .venv/bin/python benchmarks/plain_ddp.py --steps 200 --workers 4
"""

from __future__ import annotations

import argparse
import json
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from anchor import anchor_arguments, anchor_model, train_anchor
from torch.nn.parallel import DistributedDataParallel


def worker(rank: int, args: argparse.Namespace, port: int) -> None:
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.workers)
    model = anchor_model(args)
    ddp = DistributedDataParallel(model)

    def loss_fn(x, y):  # Transformer.loss, through DDP's forward so that its gradient hooks run
        return torch.nn.functional.cross_entropy(ddp(x).flatten(0, 1), y.flatten())

    result = train_anchor(args, model, loss_fn, rank, args.workers)
    if rank == 0:
        print(json.dumps(result), flush=True)
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    p = anchor_arguments(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    p.add_argument("--workers", type=int, default=4)
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    mp.spawn(worker, args=(args, free_port()), nprocs=args.workers, join=True)


if __name__ == "__main__":
    main()
