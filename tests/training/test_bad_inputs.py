"""Inputs a new user gets wrong: each fails before any worker starts, in one line that names the key as written and
the fix, and leaves nothing in the output directory."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from support import error_line

from lowcomm import data
from lowcomm.training import train
from lowcomm.training.run_dir import RunDirectory

SMOKE = ["model.size=smoke", "data.vocab_size=512", "data.context=64", "data.batch_size=4", "data.val_batches=2",
         "train.devices=1", "train.steps=8", "train.warmup=2", "train.val_every=8", "sync.sync_every=8"]


@pytest.fixture
def no_corpus(monkeypatch):
    """Reading the corpus fails the test: every check must come before it."""
    def read(*args, **kwargs):
        raise AssertionError("the corpus was read before the input was checked")
    monkeypatch.setattr(train, "offline_streams", read)


@pytest.mark.parametrize("overrides, words", [
    (["train.warmup=100"], ["train.warmup=100", "train.steps=8"]),
    (["data.vocab_size=100000", "model.vocab_size=100000"], ["data.vocab_size=100000", "at most 55,393"]),
    (["model.vocab_size=100000"], ["model.vocab_size=100000", "data.vocab_size=512"]),
    (["optim.betas=[0.9]"], ["optim.betas=[0.9] needs 2 numbers", "optim.betas=[0.9,0.95]"]),
    (["method=lordo", "optim.betas=[0.9]"], ["optim.betas=[0.9] needs 2 numbers"]),
    (["optim.lr=nan"], ["optim.lr='nan' is not a finite number"]),
    (["optim.lr=abc"], ["optim.lr='abc' is not a finite number"]),
    (["optim.eps=-1"], ["optim.eps=-1 is invalid: use eps >= 0"]),
    (["method=muon", "optim.momentum=-0.5"], ["optim.momentum=-0.5 is invalid: use momentum >= 0"]),
    (["method=dion", "optim.captured_share=1"], ["optim.captured_share=1 must lie in [0, 1)"]),
    (["method=lordo", "optim.qh_scale=0"], ["optim.qh_scale=0 is invalid: use qh_scale > 0"]),
    (["method=lordo", "optim.rank=65"], ["optim.rank=65 is invalid for the hidden matrix", "min(p, q) = 64"]),
    (["method=lordo", "optim.mu=2", "optim.qh_scale=2"], ["optim.mu is the former name of optim.qh_scale"]),
    (["model.n_heads=0"], ["model.n_heads=0 must be >= 1"]),
])
def test_a_bad_value_is_named_before_anything_runs(overrides, words, tmp_path, no_corpus):
    message = error_line(train.main, [*SMOKE, f"run.out_dir={tmp_path}", *overrides])
    assert all(w in message for w in words), message
    assert list(tmp_path.iterdir()) == []


def test_an_optimizer_that_replaced_the_methods_is_named(tmp_path, no_corpus):
    config = tmp_path / "config.yaml"
    config.write_text("method: lordo\noptim:\n  name: adamw\n")
    message = error_line(train.main, [str(config), *SMOKE, f"run.out_dir={tmp_path / 'out'}"])
    assert "optim.name=adamw replaced the optimizer of method=lordo" in message
    assert not (tmp_path / "out").exists()


def test_a_directory_holding_a_run_is_refused_before_the_corpus_is_read(tmp_path, no_corpus):
    held = tmp_path / "run"
    held.mkdir()
    (held / "record.json").write_text('{"status": "complete"}')
    message = error_line(train.main, [*SMOKE, f"run.out_dir={tmp_path}", "run.name=run"])
    assert "already holds a run (record.json status complete)" in message and "run.overwrite=true" in message
    assert sorted(p.name for p in held.iterdir()) == ["record.json"]


def test_of_two_runs_created_into_one_directory_one_gets_it(tmp_path, monkeypatch):
    from lowcomm.config import ConfigError, load_config, run_config

    loaded = load_config(None, [f"run.out_dir={tmp_path}"])
    cfg = run_config(loaded)
    first, second = RunDirectory(tmp_path / "run"), RunDirectory(tmp_path / "run")
    monkeypatch.setattr(second, "check_free", lambda overwrite=False: None)  # it looked before the first wrote
    first.create(cfg)
    with pytest.raises(ConfigError, match="taken by another run just now"):
        second.create(cfg)
    assert (tmp_path / "run" / "config.yaml").read_text() == OmegaConf.to_yaml(loaded)


def test_a_truncated_cache_file_is_named_and_rebuilt(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LOWCOMM_CACHE", str(tmp_path))
    tokens = data.offline_streams(512)[0]
    for path in sorted(tmp_path.iterdir()):  # the tokenizer and the token streams, each cut in half
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    again = data.offline_streams(512)[0]
    assert torch.equal(again, tokens)
    err = capsys.readouterr().err
    assert err.count("is unreadable") == 2 and "deleted, rebuilding it" in err and str(tmp_path) in err
