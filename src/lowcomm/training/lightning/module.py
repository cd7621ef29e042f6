"""LightningModule: the transformer, its optimizer from the registry, warmup + cosine schedule, validation."""

from __future__ import annotations

import hashlib
import math
import time

import lightning as L
import torch
from torch.utils.data import DataLoader

from lowcomm.config import RunConfig
from lowcomm.data import (
    SMOLLM_TOKENIZER,
    PackedSequences,
    ShardSampler,
    StreamingPacked,
    load_tokenizer,
    offline_streams,
    smollm_mixture,
    smollm_validation_texts,
    token_stream,
)
from lowcomm.model import Transformer
from lowcomm.optim.registry import build_from_options
from lowcomm.schedule import lr_lambda
from lowcomm.training.lightning.stopping import SignalFlag, Stop, agree_on_stop
from lowcomm.training.run_dir import NoSpace, RunDirectory, checkpoint_path, last_checkpoint, rank_checkpoint_file


def perplexity(loss: float) -> float:
    """exp(loss); inf where that overflows (a diverging run)."""
    return math.exp(loss) if loss < 709 else math.inf


def duration(seconds: float) -> str:
    """`1h02m03s`, `2m03s` or `3s`."""
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{s}s"


@torch.no_grad()
def perturb_weights(model: torch.nn.Module, relative: float, seed: int) -> None:
    """w <- w (1 + relative z) for every parameter, z ~ N(0, 1) from a generator seeded by `seed`, the same on every
    rank (a rerun perturbed at floating-point noise level, relative ~ 1e-7, the fp32 unit roundoff); 0 changes nothing."""
    if relative == 0:
        return
    generator = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.mul_(1 + relative * torch.randn(p.shape, generator=generator, dtype=p.dtype))


class LanguageModelTask(L.LightningModule):
    """Next-token training of `Transformer`; validation loss / perplexity every `train.val_every` steps
    (and before the first step), averaged over every worker's disjoint validation shard. `offline_tokens`: the
    offline corpus's (train, validation) token streams, read once by the launching process and shared with its
    workers."""

    def __init__(self, cfg: RunConfig, provenance: dict, run_dir: str | None = None,
                 offline_tokens: tuple[torch.Tensor, torch.Tensor] | None = None):
        super().__init__()
        self.cfg = cfg
        self.provenance = provenance  # run_dir.environment() as the run started: commit, versions, device
        self.run_dir = run_dir
        self.offline_tokens = offline_tokens
        self.run: RunDirectory | None = None  # rank 0 only, created in setup()
        self.model = Transformer(cfg.model)
        perturb_weights(self.model, cfg.train.init_noise, cfg.train.init_noise_seed)
        self.val_history: list[tuple[int, float]] = []
        self._last_time: float | None = None
        self._last_step = 0
        self.signals = SignalFlag()
        self.stop: Stop | None = None
        self._checkpoint_step = 0  # the step of the last checkpoint this run wrote or tried to write
        self.outcome: dict | None = None  # how the run ended, on every rank (see on_fit_end)

    # ------------------------------------------------------------------ data
    def _streams(self):
        data = self.cfg.data
        if data.corpus == "offline":
            train, val = self.offline_tokens or offline_streams(data.vocab_size)[:2]
            return PackedSequences(train, data.context), PackedSequences(val, data.context)
        tok = load_tokenizer(data.tokenizer or SMOLLM_TOKENIZER)
        rank, world = self.global_rank, self.trainer.world_size
        train = StreamingPacked(smollm_mixture(data, rank, world), tok, data.context)
        return train, PackedSequences(token_stream(smollm_validation_texts(data), tok), data.context)

    def setup(self, stage: str) -> None:
        torch.set_num_threads(self.cfg.train.threads)
        self.train_loss = torch.compile(self.model.loss) if self.cfg.train.compile else self.model.loss
        self.train_set, self.val_set = self._streams()
        if self.global_rank == 0 and self.run_dir is not None:
            self.run = RunDirectory(self.run_dir)

    def train_dataloader(self) -> DataLoader:
        data, world = self.cfg.data, self.trainer.world_size
        if isinstance(self.train_set, PackedSequences):
            # batch t of this worker is fixed by (seed, rank, world, t): a resumed run reads what the original would
            sampler = ShardSampler(len(self.train_set), self.global_rank, world, data.seed,
                                   start=self.global_step * data.batch_size)
            return DataLoader(self.train_set, batch_size=data.batch_size, sampler=sampler, drop_last=True)
        return DataLoader(self.train_set, batch_size=data.batch_size)

    def val_loader(self) -> DataLoader:
        sampler = ShardSampler(len(self.val_set), self.global_rank, self.trainer.world_size, seed=0, shuffle=False,
                               epochs=1)
        return DataLoader(self.val_set, batch_size=self.cfg.data.batch_size, sampler=sampler, drop_last=True)

    # ------------------------------------------------------------------ optimization
    def configure_optimizers(self):
        optimizer = build_from_options(self.cfg.optim_name, self.cfg.optim, self.model)
        t = self.cfg.train
        horizon = t.schedule_steps or t.steps
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(t.warmup, horizon, t.min_lr_ratio))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = self.train_loss(x, y)
        self.log("loss", loss, prog_bar=True, on_step=True, logger=False)
        return loss

    # ------------------------------------------------------------------ logging and validation
    @torch.no_grad()
    def validation_loss(self) -> float:
        """Mean validation loss over `data.val_batches` batches per worker, averaged over workers."""
        loader = self.val_loader()
        was_training = self.model.training
        self.model.eval()
        total, count = torch.zeros((), device=self.device), 0
        for i, (x, y) in enumerate(loader):
            if i == self.cfg.data.val_batches:
                break
            total += self.model.loss(x.to(self.device), y.to(self.device))
            count += 1
        self.model.train(was_training)
        mean = self.trainer.strategy.reduce(total / max(count, 1), reduce_op="mean")
        return float(mean)

    def _validate(self, step: int) -> dict:
        val = self.validation_loss()
        self.val_history.append((step, val))
        return {"val_loss": val, "val_ppl": perplexity(val)}

    def on_train_start(self) -> None:
        self.signals.install()
        if not self.val_history:  # a resumed run already has its history
            self.log_row({"step": 0, **self._validate(0)})
        self._last_time = self._train_start = time.perf_counter()
        self._last_step = self._first_step = self.global_step

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Besides the training state: the validation history, and the run config and world size that a resume
        is checked against (lowcomm.training.validation.check_resume)."""
        checkpoint["val_history"] = self.val_history
        checkpoint["run_config"] = self.cfg.tree
        checkpoint["world_size"] = self.trainer.world_size

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.val_history = list(checkpoint["val_history"])

    def save_checkpoint_if_due(self, step: int) -> None:
        """Every run.checkpoint_every steps, at a sync point, each rank writes checkpoints/step<t>.rank<r>.ckpt."""
        every = self.cfg.run.checkpoint_every
        engine = self.trainer.strategy.engine
        if every and step % every == 0 and engine.is_sync_step(step):
            engine.before_checkpoint()
            self._checkpoint_step = step
            self.trainer.save_checkpoint(checkpoint_path(self.run_dir, step))

    def log_row(self, row: dict) -> None:
        """metrics.csv (rank 0); a row that does not fit on the disk is noted, and the run stops at the next step
        boundary (lowcomm.training.lightning.stopping)."""
        strategy = self.trainer.strategy
        if self.run is None or strategy.no_space is not None:
            return
        try:
            self.run.log(row)
        except NoSpace as err:
            strategy.no_space = err

    def no_space_message(self, stop: Stop) -> str:
        """Which write failed on each rank that could not write: rank 0 knows its own; another rank writes only its
        checkpoint file of the last checkpoint step."""
        own = self.trainer.strategy.no_space
        return "; ".join(
            f"rank {rank} could not write: "
            + str(own if rank == self.global_rank and own is not None else
                  NoSpace(rank_checkpoint_file(checkpoint_path(self.run_dir, self._checkpoint_step), rank), needed))
            for rank, needed in zip(stop.ranks, stop.needed))

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        """At every step boundary: stop on a signal, a non-finite loss or a write that failed for lack of space (every
        rank alike), log, validate, checkpoint and report progress. A diverged step is logged, but neither validated nor checkpointed."""
        step = self.global_step
        t = self.cfg.train
        loss = float(outputs["loss"])
        no_space = self.trainer.strategy.no_space
        self.stop = agree_on_stop(self.trainer.strategy, step, self.signals.signum, loss,
                                  max(no_space.needed, 1) if no_space else 0)
        if self.stop is not None:
            self.trainer.should_stop = True
        diverged = self.stop is not None and self.stop.status == "diverged"
        row = {}
        basis_changed = self.trainer.strategy.engine.basis_changed(step)
        if step % t.log_every == 0 or step == t.steps or basis_changed or self.stop is not None:
            now = time.perf_counter()
            tps = (step - self._last_step) * self.tokens_per_step / max(now - self._last_time, 1e-9)
            self._last_time, self._last_step = now, step
            self.log("tok/s", tps, prog_bar=True, logger=False, rank_zero_only=True)
            row.update(loss=loss, lr=self.lr_schedulers().get_last_lr()[0], tokens_per_s=tps)
            row.update(self.step_metrics())
        if (step % t.val_every == 0 or step == t.steps) and not diverged:
            row.update(self._validate(step))
        self.log("val_loss", self.val_history[-1][1], prog_bar=True, logger=False, rank_zero_only=True)
        if row and self.run is not None:
            self.log_row({"step": step, **row})
            for logger in self.loggers:  # TensorBoard (run.loggers): the same row
                logger.log_metrics({k: v for k, v in row.items() if isinstance(v, (int, float))}, step)
            if not t.progress_bar and "loss" in row:
                self.print_progress(step, loss, row["tokens_per_s"])
        if not diverged:
            self.save_checkpoint_if_due(step)

    def print_progress(self, step: int, loss: float, tokens_per_s: float) -> None:
        """One line on rank 0 (with train.progress_bar=false): step/total, loss, latest validation loss,
        tokens/s over all workers, and the time left at the mean step time so far."""
        total = self.cfg.train.steps
        eta = (time.perf_counter() - self._train_start) / max(step - self._first_step, 1) * (total - step)
        val_step, val = self.val_history[-1]
        print(f"step {step}/{total}  loss {loss:.4f}  val_loss {val:.4f} (step {val_step})  "
              f"{tokens_per_s:,.0f} tok/s  ETA {duration(eta)}", flush=True)

    def on_fit_end(self) -> None:
        """Every rank sets `outcome` (status complete / interrupted / diverged, the step reached) and compares
        weight digests; rank 0 writes the model weights of a complete run, then the record."""
        self.signals.restore()
        identical = self.replicas_identical()
        stop = self.stop
        self.outcome = {"status": "complete", "steps": self.global_step}
        if stop is not None:
            self.outcome.update(status=stop.status, stopped_at_step=stop.step, last_checkpoint=self.resume_point())
            self.outcome.update({"signal": stop.signal, "signalled_ranks": list(stop.ranks)} if stop.signal
                                else {"failure": self.no_space_message(stop)} if stop.status == "failed"
                                else {"nonfinite_loss_ranks": list(stop.ranks)})
        if self.run is None:
            return
        _, final = self.val_history[-1]
        tokens = (self.global_step - self._first_step) * self.tokens_per_step
        if stop is None:
            try:
                self.run.write_model(self.model)
            except NoSpace as err:
                self.outcome.update(status="failed", failure=f"rank 0 could not write: {err}",
                                    last_checkpoint=self.resume_point())
        try:
            self.write_record(final, tokens, identical)
        except NoSpace as err:
            self.outcome["record"] = f"not written ({err})"

    def resume_point(self) -> str | None:
        """The checkpoint a stopped run continues from: its last complete one, else the one it resumed from."""
        checkpoint = last_checkpoint(self.run_dir, self.trainer.world_size) if self.run_dir else None
        return str(checkpoint or self.cfg.run.resume_from or "") or None

    def write_record(self, final: float, tokens: int, identical: bool) -> None:
        self.run.write_record({
            **self.outcome,
            **self.provenance,
            "world_size": self.trainer.world_size,
            "initial_val_loss": self.val_history[0][1],
            "initial_val_ppl": perplexity(self.val_history[0][1]),
            "final_val_loss": final,
            "final_val_ppl": perplexity(final),
            "parameters": sum(p.numel() for p in self.model.parameters()),
            "tokens": tokens,
            "tokens_per_s": tokens / (time.perf_counter() - self._train_start),
            "replicas_identical": identical,
            **({"peak_gpu_memory_bytes": torch.cuda.max_memory_allocated(self.device)}
               if self.device.type == "cuda" else {}),
            **self.step_metrics(),
            **self.trainer.strategy.bytes_per_step(),
            "clip/fraction": self.trainer.strategy.clip_total.fraction(),
        })

    def replicas_identical(self) -> bool:
        """True when every worker holds bit-identical weights (SHA-256 of the raw bytes, gathered)."""
        digest = hashlib.sha256()
        for p in self.model.parameters():
            digest.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        local = torch.frombuffer(bytearray(digest.digest()[:8]), dtype=torch.int64).to(self.device)
        gathered = self.trainer.strategy.all_gather(local)
        return bool((gathered == gathered.reshape(-1)[0]).all())

    @property
    def tokens_per_step(self) -> int:
        """Training tokens per optimizer step, over all workers."""
        return self.cfg.data.batch_size * self.cfg.data.context * self.trainer.world_size

    def step_metrics(self) -> dict:
        """Per-step metrics of the sync strategy: communication, optimizer state, update terms, nu_t."""
        return self.trainer.strategy.metrics()
