"""The typed run config (lowcomm.config.run_config): built once from a loaded config, frozen, picklable (it travels to
the worker processes), with errors in the config's key names, and written to config.yaml as the loaded config."""

import dataclasses
import pickle

import pytest
from omegaconf import OmegaConf

from lowcomm.config import ConfigError, load_config, run_config
from lowcomm.distributed.options import SyncOptions
from lowcomm.model import model_config
from lowcomm.optim.lowrank_adam import LowRankAdamOptions

LORDO = ["model.size=smoke", "sync.name=lordo", "sync.sync_every=8", "optim.name=lordo_local_step", "optim.rank=4"]


def test_the_sections_are_typed_with_their_defaults_filled_in():
    cfg = run_config(load_config(None, LORDO + ["model.d_model=32"]))
    assert cfg.model == model_config("smoke", d_model=32) and cfg.model_size == "smoke"
    assert cfg.optim_name == "lordo_local_step" and isinstance(cfg.optim, LowRankAdamOptions) and cfg.optim.rank == 4
    assert isinstance(cfg.sync, SyncOptions) and cfg.sync.state_sync_u == 8  # lordo's default: K_u = K


@pytest.mark.parametrize("section", ["model", "data", "optim", "sync", "train", "run"])
def test_the_run_config_and_each_section_are_frozen(section):
    cfg = run_config(load_config(None, LORDO))
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(cfg, section, None)
    part = getattr(cfg, section)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(part, dataclasses.fields(part)[0].name, None)


def test_the_run_config_survives_pickling():
    cfg = run_config(load_config(None, LORDO))
    assert pickle.loads(pickle.dumps(cfg)) == cfg


@pytest.mark.parametrize("override, message", [
    ("optim.rank=0", "^optim.rank=0 is invalid"),
    ("optim.omega=2", "^optim.omega=2 is invalid"),
    ("optim.ranks=4", "optim.ranks for optimizer 'lordo_local_step'"),
    ("sync.sync_every=0", "^sync.sync_every=0 is invalid"),
    ("sync.outer=sideways", "^sync.outer='sideways' is unknown"),
    ("model.n_heads=3", "^model.d_model=64 must split into n_heads=3"),
])
def test_a_bad_value_names_its_key(override, message):
    with pytest.raises(ConfigError, match=message):
        run_config(load_config(None, LORDO + [override]))


def test_its_tree_writes_the_yaml_of_the_loaded_config():
    loaded = load_config(None, LORDO + ["run.loggers=[csv,tensorboard]", "optim.betas=[0.9,0.99]", "optim.lr=3e-3"])
    assert OmegaConf.to_yaml(run_config(loaded).tree) == OmegaConf.to_yaml(loaded)
