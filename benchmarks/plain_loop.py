"""Anchor for the harness benchmark: a plain PyTorch training loop, one process, over the model, data, optimizer and
schedule that `lowcomm.training.train` uses (no Lightning, no sync engine, no logging). Prints one JSON line.

    .venv/bin/python benchmarks/plain_loop.py --steps 200 --threads 2
"""

from __future__ import annotations

import argparse
import json

import torch
from anchor import anchor_arguments, anchor_model, train_anchor


def main() -> None:
    args = anchor_arguments(argparse.ArgumentParser(description=__doc__.splitlines()[0])).parse_args()
    torch.set_num_threads(args.threads)
    model = anchor_model(args)
    print(json.dumps(train_anchor(args, model, model.loss)))


if __name__ == "__main__":
    main()
