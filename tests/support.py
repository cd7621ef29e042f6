"""Helpers shared by the tests: the smoke-size training overrides, a one-process harness for the sync engines
(every method with small periods, a model, optimizer and engine per rank, a training step), the one line a command
exits with, and SmolLM-schema files on disk."""

from __future__ import annotations

import json

import pytest
import torch

from lowcomm import data
from lowcomm.distributed.comm import Communicator
from lowcomm.distributed.options import sync_options
from lowcomm.distributed.sync import build_sync_engine
from lowcomm.model import Transformer, model_config
from lowcomm.optim import build_optimizer
from lowcomm.optim.protocols import CarriesBasis

# a 2-worker smoke run of lowcomm.training.train: 30 steps, validation at 15 and 30
SMOKE = ["model.size=smoke", "data.vocab_size=512", "data.context=64", "data.batch_size=8", "data.val_batches=4",
         "train.devices=2", "train.steps=30", "train.warmup=5", "train.val_every=15", "train.log_every=5",
         "train.progress_bar=false", "optim.lr=3e-3"]

RANK = 4
K = 4

# name -> (sync config, optimizer config): every method of the engine, with small periods so a few steps cover
# syncs, moment averages at their own periods, and basis refreshes.
METHODS = {
    "ddp": ({"name": "ddp"}, {"name": "adamw"}),
    "lowrank_ddp": ({"name": "lowrank_ddp", "basis_refresh_every": K},
                    {"name": "lordo_local_step", "rank": RANK, "omega": 1.0}),
    "lowrank_ddp_full": ({"name": "lowrank_ddp", "basis_refresh_every": K, "lowrank_gradient": "full"},
                         {"name": "lordo_local_step", "rank": RANK}),
    "local_adam": ({"name": "local_adam", "sync_every": K, "state_sync_u": 2, "state_sync_v": K},
                   {"name": "adamw"}),
    "diloco": ({"name": "diloco", "sync_every": K}, {"name": "adamw"}),
    "lordo": ({"name": "lordo", "sync_every": K}, {"name": "lordo_local_step", "rank": RANK}),
    "lordo_global_noqh": ({"name": "lordo_global_noqh", "sync_every": K},
                          {"name": "lordo_local_step", "rank": RANK, "omega": 1.0, "weight_decay": 0.0}),
    "lordo_local": ({"name": "lordo_local", "sync_every": K},
                    {"name": "lordo_local_step", "rank": RANK, "basis": "local", "refresh_every": K}),
    "optimizer_sync": ({"name": "optimizer_sync"}, {"name": "orth_dion", "rank_fraction": 0.25}),
    "muloco": ({"name": "diloco", "sync_every": K}, {"name": "muon"}),
    "orth_dion_local": ({"name": "orth_dion_local", "sync_every": K, "state_sync_m": 2},
                        {"name": "orth_dion", "rank_fraction": 0.25}),
    "lordo_orth_dion": ({"name": "lordo_orth_dion", "sync_every": K}, {"name": "orth_dion", "rank_fraction": 0.25}),
}


def build(method: str, comm: Communicator, seed: int = 0, sync: dict | None = None, optim: dict | None = None):
    """Smoke model (initialized differently on every rank, so setup's broadcast matters), optimizer and engine;
    `optim` with a name replaces the method's optimizer config, without one it overrides keys of it."""
    sync_cfg, optim_cfg = METHODS[method]
    torch.manual_seed(seed + 1000 * comm.rank)
    model = Transformer(model_config("smoke"))
    optim = optim or {}
    optimizer = build_optimizer(optim if "name" in optim else {**optim_cfg, **optim}, model)
    engine = build_sync_engine(sync_options({**sync_cfg, **(sync or {})}), model, optimizer, comm)
    return model, optimizer, engine


def bases(optimizer) -> list[torch.Tensor]:
    """Each matrix's basis: LowRankAdam's Q, or the Dion family's right factor Q (none for other optimizers)."""
    if isinstance(optimizer, CarriesBasis):
        return [optimizer.state[p][optimizer.basis_key] for p in optimizer.basis_params()]
    return []


def analytic_options(method: str) -> dict:
    """The accounting's method options of a METHODS entry: the sync config plus the optimizer's rank (or Dion's rank
    fraction)."""
    sync_cfg, optim_cfg = METHODS[method]
    return {**sync_cfg, **{k: optim_cfg[k] for k in ("rank", "rank_fraction") if k in optim_cfg}}


def batch(rank: int, step: int, size: int = 2, context: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """The data of (rank, step): the data position is the step."""
    g = torch.Generator().manual_seed(10_000 * rank + step)
    tokens = torch.randint(0, model_config("smoke").vocab_size, (size, context + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def train_step(model, optimizer, engine, step: int, rank: int, clip: float | None = 1.0) -> float:
    """One step of the caller's loop: backward, engine, clip, optimizer, engine."""
    x, y = batch(rank, step)
    optimizer.zero_grad(set_to_none=True)
    loss = model.loss(x, y)
    loss.backward()
    engine.before_optimizer_step(step, None if clip is None else
                                 lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), clip))
    optimizer.step()
    engine.after_optimizer_step(step)
    return loss.item()


def error_line(main, argv: list[str]) -> str:
    """The one line `main(argv)` exits with (it must exit with a message, not a traceback)."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    message = str(exit_.value.code)
    assert message.startswith("error: ") and "\n" not in message, message
    return message


def local_smollm_files(tmp_path, texts, per_source=20) -> dict[str, str]:
    """One JSONL file of `per_source` texts per SmolLM source, in the hub's schema: source name -> path."""
    files = {}
    for k, name in enumerate(data.SMOLLM_SOURCES):
        path = tmp_path / f"{name}.jsonl"
        with open(path, "w") as f:
            for text in texts[k * per_source:(k + 1) * per_source]:
                f.write(json.dumps({"text": text, "id": name}) + "\n")
        files[name] = str(path)
    return files
