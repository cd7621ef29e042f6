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


def same_bits(a: Path, b: Path) -> bool:
    """Whether two runs logged the same losses and ended with the same weights, to the bit."""
    return losses(a).equals(losses(b)) and all(torch.equal(x, y) for x, y in zip(weights(a).values(),
                                                                                    weights(b).values()))


def test_one_worker_reruns_to_the_bit_fp32_noise_changes_the_weights_and_a_short_run_is_the_start_of_a_long_one(
        tmp_path):
    first, again = (run(tmp_path, name, "train.devices=1") for name in ("first", "again"))
    assert same_bits(first, again)
    perturbed = run(tmp_path, "perturbed", "train.devices=1", "train.init_noise=1e-7")
    assert not any(torch.equal(x, y) for x, y in zip(weights(first).values(), weights(perturbed).values()))
    start = run(tmp_path, "start", "train.devices=1", "train.steps=8", "train.schedule_steps=16")
    pd.testing.assert_frame_equal(losses(start), losses(first).loc[:8], check_exact=True)


def test_four_workers_rerun_to_the_bit(tmp_path):
    assert same_bits(*(run(tmp_path, name, "train.devices=4") for name in ("first", "again")))
