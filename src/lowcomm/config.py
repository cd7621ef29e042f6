"""Run configuration: typed sections merged from YAML files and `key=value` overrides (OmegaConf).

A config file may name a `method` preset (lowcomm/methods/<method>.yaml, package data): the preset is merged first,
then the file, then the command line. Unknown keys are errors that name the key. `run_config` turns a loaded config
into one typed, frozen RunConfig, which is all a run reads.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import io
from dataclasses import dataclass, field
from importlib.resources import as_file
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from lowcomm.data import DataConfig
from lowcomm.distributed.options import SyncOptions, sync_options
from lowcomm.model import ModelConfig, model_config_from
from lowcomm.optim.registry import optimizer_options
from lowcomm.paths import METHODS_DIR, method_names


@dataclass
class ModelSection:
    size: str = "cpu"
    # any ModelConfig field overrides the named size; None keeps the size's value
    vocab_size: int | None = None
    d_model: int | None = None
    n_layers: int | None = None
    n_heads: int | None = None
    mlp: str | None = None
    d_hidden: int | None = None
    max_context: int | None = None
    tied_embeddings: bool | None = None
    rope_theta: float | None = None


@dataclass(frozen=True)
class TrainSection:
    steps: int = 600
    schedule_steps: int | None = None  # the cosine's length (default train.steps): > steps runs the start of a longer run
    warmup: int = 50
    min_lr_ratio: float = 0.1  # cosine decays the lr to this fraction of its peak
    clip: float = 1.0  # global L2-norm gradient clipping (0 disables)
    val_every: int = 100
    log_every: int = 10
    devices: int = 4
    num_nodes: int = 1
    accelerator: str = "cpu"
    precision: str = "32-true"
    seed: int = 0
    init_noise: float = 0.0  # each initial weight w -> w (1 + init_noise z), z ~ N(0, 1) from init_noise_seed
    init_noise_seed: int = 0
    threads: int = 1  # torch threads per worker process on CPU
    progress_bar: bool = True  # false: a progress line every log_every steps instead
    collective_timeout_s: float = 300.0  # a collective waiting longer than this for a peer ends the run
    compile: bool = False  # torch.compile the training loss (forward and backward; inductor, also on CPU)
    link_rate_mbit: float = 0.0  # > 0: one worker per emulated node, links capped at this rate (needs root)


@dataclass(frozen=True)
class RunSection:
    out_dir: str = "runs"
    name: str | None = None  # default: <method>-<model size>-s<seed>-<timestamp>
    checkpoint_every: int = 0  # steps between per-rank checkpoints, taken at sync points (0: none)
    resume_from: str | None = None  # a checkpoint path (checkpoints/stepNNNNNN.ckpt) to continue from
    overwrite: bool = False  # clear an existing run directory of the same name first (else it is an error)
    loggers: list[str] = field(default_factory=lambda: ["csv"])  # csv (metrics.csv, always); tensorboard adds events


@dataclass
class Config:
    method: str | None = None
    model: ModelSection = field(default_factory=ModelSection)
    data: DataConfig = field(default_factory=DataConfig)
    optim: dict[str, Any] = field(default_factory=lambda: {"name": "adamw"})
    sync: dict[str, Any] = field(default_factory=lambda: {"name": "ddp"})
    train: TrainSection = field(default_factory=TrainSection)
    run: RunSection = field(default_factory=RunSection)


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the key and the fix."""


@dataclass(frozen=True)
class Sections:
    """The `optim` and `sync` sections of a config, parsed once into their typed, validated, frozen options (the
    optimizer's options dataclass, lowcomm.optim.OPTIMIZERS[optim.name].options, and SyncOptions), defaults filled
    in. Live and stored configs are read through it alike."""

    optim_name: str
    optim: Any
    sync: SyncOptions


def parse_sections(cfg: DictConfig | dict) -> Sections:
    """Sections of a loaded (or stored) config; ConfigError in the config's key names on a bad value."""
    tree = OmegaConf.to_container(cfg) if isinstance(cfg, DictConfig) else cfg
    try:
        sync = sync_options(tree["sync"])
        return Sections(tree["optim"].get("name"), optimizer_options(tree["optim"]), sync)
    except ValueError as err:
        raise ConfigError(str(err)) from None


@dataclass(frozen=True)
class RunConfig:
    """A run's whole config, typed and frozen: what a run reads below its entry (lowcomm.training.train.train).
    `model` is the named size `model_size` with the config's overrides; optim_name, optim and sync are the parsed
    Sections; `tree` is the loaded config as plain data, which the run directory's config.yaml and each checkpoint
    store."""

    method: str | None
    model_size: str
    model: ModelConfig
    data: DataConfig
    optim_name: str
    optim: Any  # lowcomm.optim.OPTIMIZERS[optim_name].options
    sync: SyncOptions
    train: TrainSection
    run: RunSection
    tree: dict


def run_config(cfg: DictConfig) -> RunConfig:
    """The RunConfig of a loaded config (load_config); ConfigError in the config's key names on a bad value."""
    tree = OmegaConf.to_container(cfg)
    try:
        model = model_config_from(tree["model"])
    except ValueError as err:
        raise ConfigError(str(err)) from None
    sections = parse_sections(tree)
    typed = OmegaConf.to_object(cfg)
    return RunConfig(cfg.method, cfg.model.size, model, typed.data, sections.optim_name, sections.optim, sections.sync,
                     typed.train, typed.run, tree)


def _merge(base: DictConfig, update: DictConfig | dict, origin: str) -> DictConfig:
    try:
        return OmegaConf.merge(base, update)
    except ConfigKeyError as err:
        valid = sorted(f.name for f in dataclasses.fields(err.object_type)) if dataclasses.is_dataclass(err.object_type) else []
        raise ConfigError(f"{origin}: unknown key {err.full_key!r}; valid keys there: {valid}") from None
    except OmegaConfBaseException as err:
        raise ConfigError(f"{origin}: bad value for {err.full_key!r}: {err.msg.splitlines()[0]}") from None


def load_yaml(path: str | Path, text: str | None = None) -> DictConfig:
    """The YAML mapping in the file at `path` (or in `text`, read from it); a syntax error names the file, line and
    column."""
    try:
        cfg = OmegaConf.load(path if text is None else io.StringIO(text))
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark
        raise ConfigError(f"{path}:{mark.line + 1}:{mark.column + 1}: {err.problem}: fix the YAML there") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(cfg, DictConfig):
        raise ConfigError(f"{path}: the top level is a {type(cfg).__name__}, not a mapping of sections "
                          "(model:, data:, optim:, ...)")
    return cfg


def method_preset(name: str) -> DictConfig:
    """The method preset `name`: lowcomm/methods/<name>.yaml, package data (its optim and sync sections)."""
    preset = METHODS_DIR / f"{name}.yaml"
    if not preset.is_file():
        raise ConfigError(f"method={name!r} has no preset {preset}: choose one of {method_names()}")
    with as_file(preset) as path:
        return load_yaml(path)


def preset_on_schema(name: str) -> DictConfig:
    """A fresh copy of the schema <- method preset `name`, merged once per process and content of the preset."""
    preset = METHODS_DIR / f"{name}.yaml"
    text = preset.read_text() if preset.is_file() else None
    return copy.deepcopy(_preset_on_schema(name, text))


@functools.cache
def _preset_on_schema(name: str, text: str | None) -> DictConfig:
    return _merge(_schema(), method_preset(name), f"method preset {name}")  # merge copies the schema


@functools.cache
def _schema() -> DictConfig:
    return OmegaConf.structured(Config)


def schema() -> DictConfig:
    """A fresh copy of the config schema (Config with its defaults): a copy costs a sixth of building it anew."""
    return copy.deepcopy(_schema())


@functools.cache
def _schema_tree() -> dict:
    return OmegaConf.to_container(_schema())


def _on_defaults(defaults: dict, tree: dict) -> dict:
    """`defaults`, changed in place, with every value of `tree` set over it, section by section."""
    for key, value in tree.items():
        both_sections = isinstance(value, dict) and isinstance(defaults.get(key), dict)
        defaults[key] = _on_defaults(defaults[key], value) if both_sections else value
    return defaults


def with_defaults(stored: dict) -> dict:
    """A stored run config (plain containers) on the schema: a key the run's config lacks (added to the schema after
    the run) takes its default, which is the behaviour the run had."""
    return _on_defaults(copy.deepcopy(_schema_tree()), stored)


@functools.cache
def _file_layer(path: str | Path, text: str) -> DictConfig:
    """The config file at `path`, parsed once per process and content of the file: a layer load_config only reads
    and merges from (OmegaConf.merge copies it), never changes."""
    return load_yaml(path, text)


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> DictConfig:
    """Schema <- method preset <- config file <- `key=value` overrides; returns a resolved, read-only config."""
    layers = []
    if path is not None:
        if not Path(path).exists():
            raise ConfigError(f"config file {path} does not exist")
        layers.append((_file_layer(path, Path(path).read_text()), str(path)))
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value")
    layers.append((OmegaConf.from_dotlist(list(overrides)), "command line"))
    method = next((layer.get("method") for layer, _ in reversed(layers) if layer.get("method")), None)
    cfg = preset_on_schema(method) if method else schema()
    for layer, origin in layers:
        for section in ("optim", "sync"):
            # a section that names another optimizer / engine replaces the preset's section whole
            if section in layer and "name" in layer[section] and layer[section]["name"] != cfg[section].get("name"):
                cfg[section] = {}
        cfg = _merge(cfg, layer, origin)
    OmegaConf.resolve(cfg)
    OmegaConf.set_readonly(cfg, True)
    return cfg
