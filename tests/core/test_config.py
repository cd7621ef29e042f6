"""The typed run config (lowcomm.config.run_config): built once from a loaded config, frozen, picklable (it travels to
the worker processes), with errors in the config's key names, and written to config.yaml as the loaded config."""

import dataclasses
import pickle

import pytest
from omegaconf import OmegaConf

from lowcomm.config import Config, ConfigError, load_config, run_config, with_defaults
from lowcomm.distributed.options import SyncOptions
from lowcomm.model import model_config
from lowcomm.optim.lowrank_adam import LowRankAdamOptions
from lowcomm.stored import read_config_tree

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


def test_a_stored_config_reads_back_as_omegaconf_reads_it_and_takes_the_schemas_defaults(tmp_path):
    """read_config_tree against OmegaConf.load, and with_defaults against a merge onto the schema, on the config of
    a run with small and whole floats, lists and nulls, and with keys taken out of three sections."""
    loaded = load_config(None, LORDO + ["optim.lr=3e-5", "optim.betas=[0.9,0.99]", "train.steps=4", "optim.eps=1e-12",
                                        "run.loggers=[csv,tensorboard]", "train.clip=1"])
    OmegaConf.save(loaded, tmp_path / "config.yaml")
    tree = read_config_tree(tmp_path / "config.yaml", "rerun it")
    assert tree == OmegaConf.to_container(OmegaConf.load(tmp_path / "config.yaml"))
    assert tree["optim"]["lr"] == 3e-5 and tree["optim"]["eps"] == 1e-12
    older = {**tree, "optim": {k: v for k, v in tree["optim"].items() if k != "eps"},
             "train": {k: v for k, v in tree["train"].items() if k != "clip"}}
    older.pop("run")
    assert with_defaults(older) == OmegaConf.to_container(OmegaConf.merge(OmegaConf.structured(Config), older))
    assert with_defaults(older)["train"]["clip"] == Config().train.clip
