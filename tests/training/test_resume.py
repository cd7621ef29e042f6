"""Checkpoint and resume through Lightning: per-rank checkpoints at a sync point continue bit-for-bit."""

import csv
import json

import pytest
import torch
from support import SMOKE

from lowcomm.config import ConfigError, load_config
from lowcomm.training.train import train
from lowcomm.training.validation import validate

pytestmark = pytest.mark.slow  # trains with several worker processes


def losses(run_dir):
    with open(run_dir / "metrics.csv") as f:
        return {int(r["step"]): float(r["loss"]) for r in csv.DictReader(f) if r["loss"]}


@pytest.mark.parametrize("method", ["lordo", "local_adam", "dion"])
def test_resumed_run_reproduces_the_uninterrupted_one(tmp_path, method):
    common = SMOKE + [f"method={method}", "sync.sync_every=8", "train.steps=32", "train.val_every=16",
                      "train.log_every=4", "optim.lr=3e-3", f"run.out_dir={tmp_path}"]
    full = train(load_config(None, common + ["run.name=full", "run.checkpoint_every=16"]))
    checkpoint = full / "checkpoints" / "step000016.ckpt"
    states = [torch.load(checkpoint.with_suffix(f".rank{r}.ckpt"), weights_only=False)["optimizer_states"][0]["state"]
              for r in (0, 1)]
    if method != "lordo":  # LoRDO keeps E and the embeddings' AdamW moments per worker (D8, D11)
        for index, state in states[0].items():  # every rank saved the same state (Dion: buffers averaged)
            for key, value in state.items():
                assert torch.equal(value, states[1][index][key]), (key, index)
    resumed = train(load_config(None, common + ["run.name=resumed", f"run.resume_from={checkpoint}"]))
    a, b = losses(full), losses(resumed)
    assert sorted(b) == [20, 24, 28, 32]
    for step in b:
        assert b[step] == pytest.approx(a[step], abs=1e-6)
    ra, rb = (json.loads((d / "record.json").read_text()) for d in (full, resumed))
    assert rb["final_val_loss"] == pytest.approx(ra["final_val_loss"], abs=1e-6)
    assert rb["replicas_identical"]


def test_checkpoints_must_fall_on_sync_points():
    cfg = load_config(None, SMOKE + ["method=lordo", "sync.sync_every=8", "train.steps=32", "train.val_every=16",
                                     "run.checkpoint_every=12"])
    with pytest.raises(ConfigError, match="checkpoint_every"):
        validate(cfg)
