"""Anchor for the harness benchmark: a plain PyTorch training loop, one process, over the model, data, optimizer and
schedule that `lowcomm.train` uses (no Lightning, no sync engine, no logging). Prints one JSON line.

    .venv/bin/python benchmarks/plain_loop.py --steps 200 --threads 2
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch.utils.data import DataLoader

from lowcomm.data import PackedSequences, ShardSampler, offline_streams
from lowcomm.schedule import lr_lambda
from lowcomm.model import Transformer, model_config
from lowcomm.optim import build_optimizer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="cpu")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--lr", type=float, default=3e-3)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    train, val, _ = offline_streams(4096)
    model = Transformer(model_config(args.size, max_context=args.context))
    optimizer = build_optimizer({"name": "adamw", "lr": args.lr}, model)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(args.steps // 8, args.steps, 0.1))
    data = PackedSequences(train, args.context)
    loader = DataLoader(data, args.batch, sampler=ShardSampler(len(data), 0, 1, seed=0), drop_last=True)
    x_val, y_val = next(iter(DataLoader(PackedSequences(val, args.context), args.batch)))
    start = time.perf_counter()
    for step, (x, y) in enumerate(loader, start=1):
        loss = model.loss(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        schedule.step()
        if step == args.steps:
            break
    train_s = time.perf_counter() - start
    with torch.no_grad():
        val_loss = float(model.loss(x_val, y_val))
    print(json.dumps({"steps": args.steps, "train_s": train_s, "loss": float(loss.detach()), "val_loss": val_loss,
                      "tokens_per_s": args.steps * args.batch * args.context / train_s}))


if __name__ == "__main__":
    main()
