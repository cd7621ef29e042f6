"""Reruns at one commit: the same config gives the same losses and final weights to the bit (1 and 4 workers,
LoRDO across two syncs); noise at the fp32 roundoff on the initial weights (train.init_noise) does change the weights,
so the comparison can fail; a run cut short of its lr schedule (train.schedule_steps) is the start of the longer
run."""

from pathlib import Path

import pandas as pd
import pytest
import torch
from support import SMOKE

from lowcomm.config import load_config
from lowcomm.training.train import train

pytestmark = pytest.mark.slow  # trains with several worker processes

LORDO = ["method=lordo", "sync.sync_every=8", "train.steps=16", "train.val_every=8", "train.log_every=2"]


def run(tmp_path, name: str, *overrides: str) -> Path:
    """A smoke LoRDO run (2 syncs) into tmp_path/name."""
    return train(load_config(None, [*SMOKE, *LORDO, *overrides, f"run.out_dir={tmp_path}", f"run.name={name}"]))


def losses(run_dir: Path) -> pd.DataFrame:
    """Training and validation loss by step."""
    return pd.read_csv(run_dir / "metrics.csv").groupby("step")[["loss", "val_loss"]].first()


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "model.pt", weights_only=False)["model"]


@pytest.mark.parametrize("devices", [1, 4])
def test_the_same_config_gives_the_same_losses_and_weights_to_the_bit(tmp_path, devices):
    first, again = (run(tmp_path, name, f"train.devices={devices}") for name in ("first", "again"))
    pd.testing.assert_frame_equal(losses(first), losses(again), check_exact=True)
    assert all(torch.equal(a, b) for a, b in zip(weights(first).values(), weights(again).values()))
    perturbed = run(tmp_path, "perturbed", f"train.devices={devices}", "train.init_noise=1e-7")
    assert not all(torch.equal(a, b) for a, b in zip(weights(first).values(), weights(perturbed).values()))


def test_a_run_cut_short_of_its_schedule_is_the_start_of_the_longer_run(tmp_path):
    whole = losses(run(tmp_path, "whole", "train.devices=1"))
    start = losses(run(tmp_path, "start", "train.devices=1", "train.steps=8", "train.schedule_steps=16"))
    pd.testing.assert_frame_equal(start, whole.loc[:8], check_exact=True)
