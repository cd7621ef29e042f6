"""The spectral_local_steps probe preset measures the cosine on every K-step row at every sync it logs."""

from pathlib import Path

from omegaconf import OmegaConf

from lowcomm.distributed.options import sync_options
from lowcomm.repro.experiment import experiment_grid, resolved_config
from lowcomm.repro.spec import load_spec

CONFIG = Path(__file__).resolve().parents[2] / "experiments" / "spectral_local_steps" / "config.yaml"
K_STEP_ROWS = {"diloco", "local_adam", "lordo", "muloco", "orth_dion_local", "lordo_orth_dion"}


def test_probe_preset_logs_the_cosine_of_every_k_step_row_at_every_sync():
    spec = load_spec(CONFIG)
    grid = experiment_grid(spec, "probe")
    assert {run.label for run in grid} >= K_STEP_ROWS
    for run in grid:
        cfg = resolved_config(spec, run, Path("runs"))
        sync = sync_options(OmegaConf.to_container(cfg.sync))
        assert sync.kind.k_step == (run.label in K_STEP_ROWS), run.label
        if sync.kind.k_step:
            assert sync.probe_cosine and sync.sync_every % cfg.train.log_every == 0, run.label
