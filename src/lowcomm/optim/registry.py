"""Optimizer registry: `build_optimizer(cfg, model)` turns the config's `optim` section into an optimizer.

Each entry names an options dataclass (its config keys and defaults) and a builder. The config is
checked against the dataclass before anything is built, so an unknown key fails with its name, and each options
dataclass checks its values when it is made, so a bad value fails as `optim.<key>=<value>` with the fix.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
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

# option keys that were renamed, as stored run configs may still hold them: {optimizer: {old key: current key}}
LEGACY_KEYS: dict[str, dict[str, str]] = {
    **dict.fromkeys(("lordo_local_step", "ldadam", "galore"),
                    {"mu": "qh_scale", "rank_fraction": "rank_share_of_smallest_dim"}),
    **dict.fromkeys(("dion", "orth_dion", "ada_orth_dion"), {"mu": "captured_share"}),
}


def register(name: str, options: type) -> Callable[[Builder], Builder]:
    """Decorator: register `build(opts, model)` under `name` with the options dataclass `options`."""

    def wrap(build: Builder) -> Builder:
        if name in OPTIMIZERS:
            raise ValueError(f"optimizer {name!r} is registered twice")
        OPTIMIZERS[name] = Entry(options, build)
        return build

    return wrap


def require(ok: bool, message: str) -> None:
    """An options check: ValueError(message) unless ok (the message names `optim.<key>=<value>` and the fix)."""
    if not ok:
        raise ValueError(message)


def current_keys(name: str, cfg: Mapping[str, Any]) -> dict[str, Any]:
    """`cfg` with every legacy key of optimizer `name` (LEGACY_KEYS) under its current name; ValueError when a
    config gives both names of one option."""
    renamed = LEGACY_KEYS.get(name, {})
    for old, new in renamed.items():
        require(not (old in cfg and new in cfg),
                f"optim.{old} is the former name of optim.{new} for optimizer {name!r}: give only optim.{new}")
    return {renamed.get(key, key): value for key, value in cfg.items()}


def optimizer_options(cfg: Mapping[str, Any]) -> Any:
    """The options dataclass of `cfg['name']` filled from `cfg` (legacy keys under their current names, values
    checked by the dataclass); ValueError on an unknown name or key or a bad value."""
    cfg = dict(cfg)
    name = cfg.pop("name", None)
    if name not in OPTIMIZERS:
        raise ValueError(f"optim.name={name!r} is not a registered optimizer: choose one of {sorted(OPTIMIZERS)}")
    cfg = current_keys(name, cfg)
    cls = OPTIMIZERS[name].options
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(cfg) - fields)
    if unknown:
        raise ValueError(
            f"unknown key(s) optim.{', optim.'.join(unknown)} for optimizer {name!r}: valid keys are {sorted(fields)}"
        )
    hints = typing.get_type_hints(cls)
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}
    return cls(**{k: typed_option(k, v, hints[k], defaults[k]) for k, v in cfg.items()})


def typed_option(key: str, value: Any, hint: Any, default: Any) -> Any:
    """An option's value as its declared type (float, int, bool, str, a fixed-length tuple of floats, or None where
    allowed); a ValueError names `optim.<key>`, the value and the fix."""
    kinds = set(typing.get_args(hint)) if typing.get_origin(hint) in (typing.Union, types.UnionType) else {hint}
    if value is None and type(None) in kinds:
        return None
    kind = next(iter(kinds - {type(None)}))
    if typing.get_origin(kind) is tuple:
        if not isinstance(value, (list, tuple)) or len(value) != len(default):
            example = ",".join(f"{v:g}" for v in default)
            raise ValueError(f"optim.{key}={value} needs {len(default)} numbers: e.g. optim.{key}=[{example}]")
        return tuple(typed_option(f"{key}[{i}]", v, float, 0.0) for i, v in enumerate(value))
    if kind is bool or kind is str:
        if not isinstance(value, kind):
            raise ValueError(f"optim.{key}={value!r} must be {'true or false' if kind is bool else 'a word'}")
        return value
    try:
        number = kind(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        number = math.nan
    if isinstance(value, (int, float)) and not isinstance(value, bool) and number == value:
        return value  # as written (2 stays 2 in messages)
    if not math.isfinite(number) or (kind is int and number != float(value)):
        example = f", e.g. optim.{key}={default}" if default is not None else ""
        raise ValueError(f"optim.{key}={value!r} is not {'an integer' if kind is int else 'a finite number'}: "
                         f"give one{example}")
    return number


def build_optimizer(cfg: Mapping[str, Any], model: nn.Module) -> torch.optim.Optimizer:
    """Build the optimizer named by `cfg['name']` for `model` (param groups routed by `algorithm`)."""
    return build_from_options(cfg["name"], optimizer_options(cfg), model)


def build_from_options(name: str, opts: Any, model: nn.Module) -> torch.optim.Optimizer:
    """Build optimizer `name` from its parsed options (optimizer_options) for `model`."""
    return OPTIMIZERS[name].build(opts, model)
