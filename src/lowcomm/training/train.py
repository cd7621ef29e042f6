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

import torch
from omegaconf import DictConfig

from lowcomm.config import ConfigError, RunConfig, load_config, run_config
from lowcomm.data import offline_streams
from lowcomm.quiet import quiet_libraries
from lowcomm.training.command import INSIDE_EMULATED_NETWORK, RunEnded, run_command
from lowcomm.training.validation import check_config, check_environment


def metric_loggers(cfg: RunConfig, run_dir: Path) -> list:
    """Lightning loggers beside metrics.csv: TensorBoard's event files in <run_dir>/tensorboard/ with run.loggers
    naming tensorboard (`tensorboard --logdir <run_dir>`)."""
    if "tensorboard" not in cfg.run.loggers:
        return []
    from lightning.pytorch.loggers import TensorBoardLogger

    return [TensorBoardLogger(save_dir=run_dir, name="tensorboard", version="", default_hp_metric=False)]


def run_name(cfg: RunConfig) -> str:
    if cfg.run.name:
        return cfg.run.name
    method = cfg.method or cfg.sync.name
    return f"{method}-{cfg.model_size}-s{cfg.train.seed}-{time.strftime('%Y%m%d-%H%M%S')}"


def on_cpu(cfg: RunConfig) -> bool:
    return cfg.train.accelerator == "cpu" or (cfg.train.accelerator == "auto" and not torch.cuda.is_available())


def starts_workers(cfg: RunConfig) -> bool:
    """True where this process starts the CPU workers itself (from a fork server); one worker runs in this process,
    and processes started by torchrun / SLURM are workers already."""
    return on_cpu(cfg) and "LOCAL_RANK" not in os.environ and cfg.train.devices * cfg.train.num_nodes > 1


def build_strategy(cfg: RunConfig):
    """The SyncStrategy of the config's sync options over gloo (CPU) or NCCL (GPU), on workers it starts itself, in this
    process (one worker), or on processes started by torchrun / SLURM (one per device)."""
    from lowcomm.training.lightning.strategy import SyncStrategy

    t = cfg.train
    return SyncStrategy(
        cfg.sync, t.clip, t.collective_timeout_s, (t.log_every, t.steps),
        process_group_backend="gloo" if on_cpu(cfg) else "nccl",
        start_method="forkserver" if starts_workers(cfg) else "popen",
    )


def resume_hint(checkpoint: str | None) -> str:
    if checkpoint:
        return f"last checkpoint {checkpoint} (continue with run.resume_from={checkpoint} and a new run.name)"
    return "no checkpoint to continue from (set run.checkpoint_every to write some)"


def ended(outcome: dict, cfg: RunConfig, run_dir: Path) -> RunEnded:
    """The one-line message and exit status of a run that stopped early, from its outcome."""
    record = run_dir / "record.json"
    if outcome["status"] == "diverged":
        ranks = outcome["nonfinite_loss_ranks"]
        on = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
        return RunEnded(f"training diverged: the loss is not finite at step {outcome['stopped_at_step']} "
                        f"({on}): lower optim.lr (now {cfg.optim.lr}) or raise train.warmup; "
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


def failed(cfg: RunConfig, run_dir: Path, failures: dict[int, str], received: int | None,
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
    directory of a complete run, else raise RunEnded (interrupted, diverged, a worker failed). The loaded config
    `cfg` is made typed here (lowcomm.config.run_config); the run reads only that."""
    config = run_config(cfg)
    if config.train.link_rate_mbit > 0 and not os.environ.get(INSIDE_EMULATED_NETWORK):
        from lowcomm.training.emulated_network import launch

        return launch(config)  # it starts one agent per emulated node, each of which comes back here
    environ = dict(os.environ)  # Lightning sets PL_GLOBAL_SEED, MASTER_PORT, LOCAL_RANK, ... in this process
    from lowcomm.training.lightning.workers import start_worker_server

    if starts_workers(config):
        start_worker_server()  # its imports overlap with this function's until the workers start
    check_config(config)
    check_environment(config)
    from lowcomm.training.run_dir import RunDirectory, environment

    provenance = environment(config.train.accelerator)  # the code this run starts from (its workers import it now)
    run_dir = Path(config.run.out_dir) / run_name(config)
    if int(os.environ.get("RANK", "0")) == 0:
        RunDirectory(run_dir).check_free(config.run.overwrite)  # before the corpus is read
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
    offline_tokens = offline_streams(config.data.vocab_size)[:2] if config.data.corpus == "offline" else None
    resume_from = config.run.resume_from
    if config.run.overwrite and resume_from and run_dir.resolve() in Path(resume_from).resolve().parents:
        raise ConfigError(f"run.overwrite=true would delete run.resume_from={resume_from}: choose another "
                          "run.name for the resumed run")
    if int(os.environ.get("RANK", "0")) == 0:
        RunDirectory(run_dir).create(config, overwrite=config.run.overwrite)
    L.seed_everything(config.train.seed, workers=True, verbose=False)
    task = LanguageModelTask(config, provenance, str(run_dir), offline_tokens)
    t = config.train
    trainer = L.Trainer(
        accelerator=t.accelerator,
        devices=t.devices,
        num_nodes=t.num_nodes,
        strategy=build_strategy(config),
        precision=t.precision,
        max_steps=t.steps,
        logger=metric_loggers(config, run_dir) or False,
        enable_checkpointing=False,
        enable_progress_bar=t.progress_bar,
        callbacks=[TQDMProgressBar()] if t.progress_bar else [],  # tqdm's bar, whether or not rich is installed
        enable_model_summary=False,
        num_sanity_val_steps=0,
        use_distributed_sampler=False,
        log_every_n_steps=t.log_every,
    )
    try:
        trainer.fit(task, ckpt_path=resume_from)
    except WorkerFailed as failure:  # workers started here: the parent names the rank
        raise failed(config, run_dir, failure.failures, failure.signal, provenance) from None
    except Exception as err:  # a process started by torchrun / SLURM: its own collective failed
        if not is_collective_failure(err):
            raise
        rank = int(os.environ.get("RANK", "0"))
        raise failed(config, run_dir, {rank: f"had a collective fail ({collective_error(err)}): another worker "
                                          f"died or did not answer within train.collective_timeout_s"}, None,
                     provenance) from None
    finally:  # a run inside a longer-lived process leaves its environment as it found it
        os.environ.clear()
        os.environ.update(environ)
    if task.outcome["status"] != "complete":
        raise ended(task.outcome, config, run_dir)
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




if __name__ == "__main__":
    main()
