"""The plain PyTorch training loop the harness benchmark measures `lowcomm.training.train` against (benchmarks/plain_loop.py
in one process, benchmarks/plain_ddp.py under DistributedDataParallel): the model, data, AdamW and schedule that
`lowcomm.training.train` uses with method=ddp, and nothing else."""

from __future__ import annotations

import argparse
import time
from typing import Callable

import torch
from torch.utils.data import DataLoader

from lowcomm.data import PackedSequences, ShardSampler, offline_streams
from lowcomm.model import Transformer, model_config
from lowcomm.optim import build_optimizer
from lowcomm.schedule import lr_lambda


def anchor_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--size", default="cpu")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--lr", type=float, default=3e-3)
    return parser


def anchor_model(args: argparse.Namespace) -> Transformer:
    torch.manual_seed(0)
    return Transformer(model_config(args.size, max_context=args.context))


def train_anchor(args: argparse.Namespace, model: Transformer, loss_fn: Callable, rank: int = 0,
                 world: int = 1) -> dict:
    """`args.steps` steps of this worker's shard (loss_fn(x, y), clipping at 1, AdamW, warmup + cosine); the
    training time, last loss and a validation batch's loss."""
    train, val, _ = offline_streams(4096)
    optimizer = build_optimizer({"name": "adamw", "lr": args.lr}, model)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(args.steps // 8, args.steps, 0.1))
    data = PackedSequences(train, args.context)
    loader = DataLoader(data, args.batch, sampler=ShardSampler(len(data), rank, world, seed=0), drop_last=True)
    x_val, y_val = next(iter(DataLoader(PackedSequences(val, args.context), args.batch)))
    start = time.perf_counter()
    for step, (x, y) in enumerate(loader, start=1):
        loss = loss_fn(x, y)
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
    return {"steps": args.steps, "train_s": train_s, "loss": float(loss.detach()), "val_loss": val_loss,
            "tokens_per_s": args.steps * args.batch * args.context * world / train_s}
