"""SyncStrategy: Lightning's DDP process management without DistributedDataParallel.

The model is not wrapped; each optimizer step runs   backward -> engine.before_optimizer_step (e.g. gradient
all-reduce, then global-norm clipping, then a global basis where due) -> optimizer.step() ->
engine.after_optimizer_step (e.g. the K-step sync), with the sync engine of the parsed sync options (lowcomm.distributed.sync)
and every collective through one Communicator.

Clipping acts on the gradient the optimizer sees on this worker: the averaged gradient where the method all-reduces
gradients before the step (ddp, muon), the local gradient otherwise (K-step methods; lowrank_ddp, whose projected
gradients are averaged inside the step; Dion's family, which averages its factors inside the step).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import torch
from lightning.pytorch.core.optimizer import LightningOptimizer
from lightning.pytorch.strategies import DDPStrategy

from lowcomm.distributed.comm import Communicator
from lowcomm.distributed.options import SyncOptions
from lowcomm.distributed.sync import SyncEngine, build_sync_engine
from lowcomm.optim.protocols import ReportsSpectralStats, ReportsUpdateRMS
from lowcomm.training.lightning.launcher import SupervisedLauncher
from lowcomm.training.run_dir import NoSpace, rank_checkpoint_file, tensor_bytes, write_atomically


@dataclass
class ClipCounter:
    """Steps taken and steps whose gradient norm exceeded the clipping threshold (clipping bound)."""

    steps: int = 0
    bound: int = 0

    def add(self, bound: bool) -> None:
        self.steps += 1
        self.bound += int(bound)

    def fraction(self) -> float:
        return self.bound / self.steps if self.steps else 0.0


class SyncStrategy(DDPStrategy):
    strategy_name = "lowcomm_sync"

    def __init__(self, sync: SyncOptions, clip: float, collective_timeout_s: float, logged_steps: tuple[int, int],
                 **kwargs: Any):
        super().__init__(timeout=timedelta(seconds=collective_timeout_s), **kwargs)
        self.collective_timeout_s = collective_timeout_s
        self.sync = sync
        self.clip = clip
        self.log_every, self.last_step = logged_steps  # the steps whose update terms are measured (their rows)
        self.engine: SyncEngine | None = None
        self.clip_since_log = ClipCounter()
        self.clip_total = ClipCounter()
        self.no_space: NoSpace | None = None  # this rank's first write that failed for lack of disk space

    def _configure_launcher(self) -> None:
        """Workers this process starts run under the SupervisedLauncher (signals forwarded, a failed worker ends the
        run)."""
        if self._start_method == "forkserver":
            self._launcher = SupervisedLauncher(self, stop_grace_s=self.collective_timeout_s)
        else:
            super()._configure_launcher()

    def _setup_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model

    def _register_ddp_hooks(self) -> None:
        pass

    @property
    def restore_checkpoint_after_setup(self) -> bool:
        return True  # the engine must exist before its state is restored

    def setup(self, trainer) -> None:
        super().setup(trainer)
        module = self.lightning_module
        (optimizer,) = [opt.optimizer if isinstance(opt, LightningOptimizer) else opt for opt in self.optimizers]
        self.engine = build_sync_engine(self.sync, module.model, optimizer, Communicator())
        self.engine.setup()
        self.first_step = 0

    def teardown(self) -> None:
        """Lightning's teardown, then the process group is destroyed: a run inside a longer-lived process (one
        worker, a notebook, a test) leaves no store listening on MASTER_PORT."""
        super().teardown()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()

    def rank_path(self, filepath) -> Path:
        """Checkpoints are per rank (workers differ between syncs in their local state, e.g. error feedback)."""
        return rank_checkpoint_file(filepath, self.global_rank)

    def save_checkpoint(self, checkpoint: dict, filepath, storage_options=None) -> None:
        """This rank's file, written under a temporary name and renamed: a file of that name is always whole."""
        checkpoint["sync_engine"] = self.engine.state_dict()
        try:
            write_atomically(self.rank_path(filepath), tensor_bytes(checkpoint),
                             lambda tmp: self.checkpoint_io.save_checkpoint(checkpoint, tmp,
                                                                            storage_options=storage_options))
        except NoSpace as err:  # noted, not raised: every rank still meets the barrier that follows a checkpoint
            self.no_space = self.no_space or err

    def load_checkpoint(self, checkpoint_path, weights_only=None) -> dict:
        checkpoint = self.checkpoint_io.load_checkpoint(self.rank_path(checkpoint_path), weights_only=False)
        self.engine.load_state_dict(checkpoint["sync_engine"])
        self.first_step = self.engine.step
        return checkpoint

    def optimizer_step(self, optimizer, closure: Callable[[], Any], model=None, **kwargs: Any) -> Any:
        loss = closure()
        step = self.lightning_module.global_step + 1
        if isinstance(self.engine.optimizer, ReportsUpdateRMS):  # the norms cost a tenth of a LoRDO step: log steps only
            self.engine.optimizer.measure_update_rms = step % self.log_every == 0 or step == self.last_step
        self.engine.before_optimizer_step(step, self._clip_gradients if self.clip else None)
        optimizer.step()
        self.engine.after_optimizer_step(step)
        return loss

    def _clip_gradients(self) -> None:
        norm = torch.nn.utils.clip_grad_norm_(self.lightning_module.model.parameters(), self.clip)
        bound = bool(norm > self.clip)
        self.clip_since_log.add(bound)
        self.clip_total.add(bound)

    def metrics(self) -> dict[str, float]:
        """The engine's metrics, the share of steps since the last call whose gradient was clipped (this worker's
        gradient, see the module docstring), and nu_t and the rank (mean, max, per matrix by name) where the
        optimizer reports them (Dion family)."""
        if self.engine is None:
            return {}
        out = self.engine.metrics()
        if self.clip:
            out["clip/fraction"] = self.clip_since_log.fraction()
            self.clip_since_log = ClipCounter()
        optimizer = self.engine.optimizer
        if isinstance(optimizer, ReportsSpectralStats):
            out.update({f"spectral/{k}": float(v) for k, v in optimizer.spectral_stats().items()})
            for name, stats in optimizer.spectral_by_matrix().items():
                out[f"spectral/nu/{name}"] = float(stats["nu"])
                out[f"spectral/rank/{name}"] = float(stats["rank"])
        return out

    def bytes_per_step(self) -> dict[str, float]:
        """Bytes on the wire per worker per training step by kind (and total), averaged over steps 1..t;
        the start-up broadcast of step 0 is reported apart as `setup_bytes`."""
        comm, steps = self.engine.comm, max(self.engine.step - self.first_step, 1)
        totals: dict[str, float] = {}
        for r in comm.records:
            key = "setup_bytes" if r.step <= self.first_step else f"bytes_per_step/{r.kind}"
            totals[key] = totals.get(key, 0.0) + r.wire
        out = {k: (v if k == "setup_bytes" else v / steps) for k, v in totals.items()}
        out["bytes_per_step/total"] = sum(v for k, v in out.items() if k.startswith("bytes_per_step/"))
        return out
