"""Every method preset trains end to end through Lightning on 2 gloo workers and ends with identical replicas."""

import csv
import json

import pytest
from support import SMOKE

from lowcomm.config import load_config
from lowcomm.paths import method_names
from lowcomm.training.train import train

pytestmark = pytest.mark.slow  # trains with several worker processes

METHODS = method_names()


def run_method(tmp_path, method, extra=()):
    overrides = SMOKE + [f"method={method}", "sync.sync_every=8", "train.steps=16", "train.val_every=8",
                         "train.log_every=8", f"run.out_dir={tmp_path}", f"run.name={method}", *extra]
    overrides = [o for o in overrides if not o.startswith("optim.lr=")]  # each optimizer's own default lr
    return json.loads((train(load_config(None, overrides)) / "record.json").read_text())


def subspace_angles(run_dir) -> dict[int, float]:
    """Largest principal angle between consecutive global bases, by the step of each change of basis."""
    with open(run_dir / "metrics.csv") as f:
        return {int(r["step"]): float(r["subspace/max_angle"]) for r in csv.DictReader(f)
                if r.get("subspace/max_angle")}


def training_losses(run_dir) -> dict[int, float]:
    with open(run_dir / "metrics.csv") as f:
        return {int(r["step"]): float(r["loss"]) for r in csv.DictReader(f) if r.get("loss")}


def tensorboard_scalars(run_dir) -> dict[str, dict[int, float]]:
    """Every scalar of the run's TensorBoard event files: tag -> {step: value}."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard")).Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}


@pytest.mark.parametrize("method", METHODS)
def test_method_learns_and_keeps_replicas_identical(tmp_path, method):
    record = run_method(tmp_path, method, ["run.loggers=[csv,tensorboard]"] if method == "lordo" else [])
    assert record["replicas_identical"] is True
    assert record["final_val_loss"] < record["initial_val_loss"]
    assert record["bytes_per_step/total"] > 0
    assert 0 <= record["clip/fraction"] <= 1
    angles = subspace_angles(tmp_path / method)
    if method == "lordo_global_noqh":  # every update in range(Q): the subspace stays put at every sync
        assert sorted(angles) == [8, 16] and max(angles.values()) < 1e-2, angles
    elif method == "lordo":  # the full-rank term moves it
        assert sorted(angles) == [8, 16] and min(angles.values()) > 0.1, angles
        scalars = tensorboard_scalars(tmp_path / method)  # metrics.csv's rows, as TensorBoard events
        assert scalars["subspace/max_angle"] == pytest.approx(angles)
        assert {"loss", "lr", "val_loss", "comm/step_bytes", "update_rms/full"} <= set(scalars)
        assert sorted(scalars["loss"]) == [8, 16] and sorted(scalars["val_loss"]) == [8, 16]
    elif method == "lordo_orth_dion":  # Q from Delta at every sync
        assert sorted(angles) == [8, 16], angles
    if method in ("orth_dion_local", "lordo_orth_dion"):  # Orth-Dion without per-step communication
        sent = {k for k, v in record.items() if k.startswith("bytes_per_step/") and v and k != "bytes_per_step/total"}
        assert sent == {"bytes_per_step/pseudo_gradient", "bytes_per_step/optimizer_state"}, sent
        assert record["spectral/nu_max"] == pytest.approx(1.0, abs=1e-5)


def test_diloco_with_outer_lr_1_and_no_momentum_on_one_worker_is_plain_training(tmp_path):
    """W <- W_anchor + 1 (W_1 - W_anchor): one worker's outer step hands back its own weights, so over 32 steps (4 outer
    steps) DiLoCo's losses are DDP AdamW's."""
    one_worker = ["train.devices=1", "train.steps=32", "train.val_every=16"]
    ddp = run_method(tmp_path, "ddp", one_worker)
    diloco = run_method(tmp_path, "diloco", [*one_worker, "sync.outer_lr=1.0", "sync.outer_momentum=0.0"])
    assert ddp["final_val_loss"] < ddp["initial_val_loss"] - 0.1
    assert diloco["final_val_loss"] == pytest.approx(ddp["final_val_loss"], abs=1e-4)
    losses = [training_losses(tmp_path / name) for name in ("ddp", "diloco")]
    assert sorted(losses[0]) == [8, 16, 24, 32]
    assert losses[1] == pytest.approx(losses[0], abs=1e-4)


def test_dion_family_sends_factors_not_matrix_gradients(tmp_path):
    ddp, orth = run_method(tmp_path, "ddp"), run_method(tmp_path, "orth_dion")
    sent = {k for k, v in orth.items() if k.startswith("bytes_per_step/") and v and k != "bytes_per_step/total"}
    assert sent == {"bytes_per_step/factor", "bytes_per_step/gradient"}
    assert orth["bytes_per_step/total"] < ddp["bytes_per_step/total"]
    assert orth["spectral/nu_max"] == pytest.approx(1.0, abs=1e-5)
    per_matrix = {k.removeprefix("spectral/nu/") for k in orth if k.startswith("spectral/nu/")}
    assert {"blocks.0.attn.q.weight", "blocks.0.attn.k.weight", "blocks.0.attn.v.weight"} <= per_matrix
