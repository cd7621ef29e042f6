"""Optimizer registry: `build_optimizer(cfg, model)` turns the config's `optim` section into an optimizer.

Each entry names an options dataclass (its config keys and defaults) and a builder. The config is
checked against the dataclass before anything is built, so an unknown key fails with its name.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch
from torch import nn

Builder = Callable[[Any, nn.Module], torch.optim.Optimizer]


@dataclass(frozen=True)
class Entry:
    options: type
    build: Builder


OPTIMIZERS: dict[str, Entry] = {}


def register(name: str, options: type) -> Callable[[Builder], Builder]:
    """Decorator: register `build(opts, model)` under `name` with the options dataclass `options`."""

    def wrap(build: Builder) -> Builder:
        if name in OPTIMIZERS:
            raise ValueError(f"optimizer {name!r} is registered twice")
        OPTIMIZERS[name] = Entry(options, build)
        return build

    return wrap


def optimizer_options(cfg: Mapping[str, Any]) -> Any:
    """The options dataclass of `cfg['name']` filled from `cfg`; ValueError on an unknown name or key."""
    cfg = dict(cfg)
    name = cfg.pop("name", None)
    if name not in OPTIMIZERS:
        raise ValueError(f"optim.name={name!r} is not a registered optimizer: choose one of {sorted(OPTIMIZERS)}")
    cls = OPTIMIZERS[name].options
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(cfg) - fields)
    if unknown:
        raise ValueError(
            f"unknown key(s) optim.{', optim.'.join(unknown)} for optimizer {name!r}: valid keys are {sorted(fields)}"
        )
    cfg = {k: tuple(v) if isinstance(v, list) else v for k, v in cfg.items()}
    return cls(**cfg)


def build_optimizer(cfg: Mapping[str, Any], model: nn.Module) -> torch.optim.Optimizer:
    """Build the optimizer named by `cfg['name']` for `model` (param groups routed by `algorithm`)."""
    opts = optimizer_options(cfg)
    return OPTIMIZERS[cfg["name"]].build(opts, model)
