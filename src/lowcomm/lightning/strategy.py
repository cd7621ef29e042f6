"""SyncStrategy: Lightning's DDP process management without DistributedDataParallel.

The model is not wrapped; each optimizer step runs   backward -> engine.before_optimizer_step (e.g. gradient
all-reduce) -> global-norm clipping -> optimizer.step() -> engine.after_optimizer_step (e.g. the K-step sync),
with the sync engine of `cfg.sync` (lowcomm.distributed.sync) and every collective through one Communicator.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from lightning.pytorch.strategies import DDPStrategy
from omegaconf import DictConfig, OmegaConf

from ..distributed.comm import Communicator
from ..distributed.sync import SyncEngine, build_sync_engine


class SyncStrategy(DDPStrategy):
    strategy_name = "lowcomm_sync"

    def __init__(self, sync_cfg: DictConfig | dict, clip: float, **kwargs: Any):
        super().__init__(**kwargs)
        self.sync_cfg = OmegaConf.to_container(sync_cfg) if isinstance(sync_cfg, DictConfig) else dict(sync_cfg)
        self.clip = clip
        self.engine: SyncEngine | None = None

    def _setup_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model

    def _register_ddp_hooks(self) -> None:
        pass

    def setup(self, trainer) -> None:
        super().setup(trainer)
        module = self.lightning_module
        (optimizer,) = [opt.optimizer if hasattr(opt, "optimizer") else opt for opt in self.optimizers]
        self.engine = build_sync_engine(self.sync_cfg, module.model, optimizer, Communicator())
        self.engine.setup()

    def optimizer_step(self, optimizer, closure: Callable[[], Any], model=None, **kwargs: Any) -> Any:
        loss = closure()
        step = self.lightning_module.global_step + 1
        self.engine.before_optimizer_step(step)
        if self.clip:
            torch.nn.utils.clip_grad_norm_(self.lightning_module.model.parameters(), self.clip)
        optimizer.step()
        self.engine.after_optimizer_step(step)
        return loss

    def metrics(self) -> dict[str, float]:
        return self.engine.metrics() if self.engine is not None else {}
