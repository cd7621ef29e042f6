"""Sync engines: when and what data-parallel workers exchange. Framework-free; every byte through a Communicator.

One engine, parts switched on by the sync kind (options.SYNC_KINDS):
  per-step      G <- mean_m G_m (ddp; lowrank_ddp sends Q^T G for the low-rank matrices, D9)
  global basis  Q = top-r singular vectors of an all-reduced G (lowrank_ddp, every T steps; LoRDO's first step, D1)
                or of Delta (LoRDO, every sync), installed in the optimizer with the moments rotated (D4)
  K-step        Delta = mean_m(W_m - W_anchor); W = W_anchor + Delta (or a Nesterov outer step); W_anchor = W
  moments       u <- mean_m u_m every K_u steps, v <- mean_m v_m every K_v steps (D8); Dion's M every K_M steps
  local Dion    the Dion family steps without its Communicator between syncs; with a global subspace its right
                factors Q are replaced at every sync by the top-r right singular vectors of Delta (tall orientation)
  probe         optional: the all-reduced gradient summed over the K steps, compared with Delta at each sync; with
                a compressed Delta, the basis of the dense Delta against the installed one (own ledger, kind probe)
The caller's loop, with t counted from 1:
    engine.setup()
    for t in 1, 2, ...:
        backward; engine.before_optimizer_step(t, clip); optimizer.step(); engine.after_optimizer_step(t)
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import torch
from torch import nn

from lowcomm.distributed.comm import KINDS, Communicator
from lowcomm.distributed.compression import CompressedPseudoGradient, Compression
from lowcomm.distributed.options import SYNC_KINDS, SyncKind, SyncOptions
from lowcomm.optim.projection import principal_angles, projection_side, top_basis
from lowcomm.optim.protocols import (
    CarriesBasis,
    CountsStateBytes,
    ReportsUpdateRMS,
    SynchronizesItself,
)


def lowrank_groups(optimizer: torch.optim.Optimizer) -> list[dict]:
    """The optimizer's parameter groups with `algorithm="lowrank"` (none for a full-rank optimizer)."""
    return [g for g in optimizer.param_groups if g.get("algorithm") == "lowrank"]


def dion_groups(optimizer: torch.optim.Optimizer) -> list[dict]:
    """The optimizer's parameter groups with `algorithm="dion"` (the Dion family's matrices)."""
    return [g for g in optimizer.param_groups if g.get("algorithm") == "dion"]


class GradientAllReduce:
    """G <- mean_m G_m for `params` (kind "gradient"); a parameter without a gradient contributes zeros."""

    def __init__(self, params: list[nn.Parameter], comm: Communicator):
        self.params = params
        self.comm = comm

    def __call__(self) -> None:
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        self.comm.all_reduce([p.grad for p in self.params], "gradient")


class PseudoGradientSync:
    """The K-step sync. Delta = mean_m(W_m - W_anchor) (kind "pseudo_gradient"), then the outer step and W_anchor = W:
    average (D2): W = W_anchor + Delta;
    nesterov (DiLoCo): SGD with Nesterov momentum beta_o (sync.outer_momentum) on the outer gradient -Delta:
        b = beta_o b - Delta, W = W_anchor + lr (Delta - beta_o b)."""

    def __init__(self, named_params: list[tuple[str, nn.Parameter]], comm: Communicator, outer: str,
                 lr: float, momentum: float, compression: Compression | None = None, seed: int = 0):
        self.names = [n for n, _ in named_params]
        self.params = [p for _, p in named_params]
        self.comm = comm
        self.compressed = (CompressedPseudoGradient(self.params, comm, compression, seed) if compression is not None
                           else None)
        self.nesterov = outer == "nesterov"
        self.lr, self.outer_momentum = lr, momentum
        self.anchor = [p.detach().clone() for p in self.params]
        self.momentum = [torch.zeros_like(p) for p in self.params] if self.nesterov else []

    def reset_anchor(self) -> None:
        """W_anchor = W."""
        for a, p in zip(self.anchor, self.params):
            a.copy_(p.detach())

    def local_deltas(self) -> list[torch.Tensor]:
        """This worker's W_m - W_anchor for every parameter."""
        return [p.detach() - a for p, a in zip(self.params, self.anchor)]

    @torch.no_grad()
    def __call__(self) -> list[torch.Tensor]:
        """Run the sync; returns Delta for every parameter (identical on every rank)."""
        deltas = self.local_deltas()
        if self.compressed is not None:
            deltas = self.compressed(deltas)
        else:
            self.comm.all_reduce(deltas, "pseudo_gradient")
        for i, (p, a, d) in enumerate(zip(self.params, self.anchor, deltas)):
            if self.nesterov:
                b = self.momentum[i].mul_(self.outer_momentum).sub_(d)
                a.add_(torch.sub(d, b, alpha=self.outer_momentum), alpha=self.lr)
            else:
                a.add_(d)
            p.copy_(a)
        return deltas

    def state_dict(self) -> dict[str, dict[str, torch.Tensor]]:
        sd = {"anchor": {n: a.clone() for n, a in zip(self.names, self.anchor)}}
        if self.nesterov:
            sd["outer_momentum"] = {n: b.clone() for n, b in zip(self.names, self.momentum)}
        if self.compressed is not None:
            sd["compression_error"] = {n: e.clone() for n, e in zip(self.names, self.compressed.errors)}
        return sd

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        buffers = [("anchor", self.anchor)] + ([("outer_momentum", self.momentum)] if self.nesterov else []) + (
            [("compression_error", self.compressed.errors)] if self.compressed is not None else [])
        for key, tensors in buffers:
            if key not in sd or set(sd[key]) != set(self.names):
                raise ValueError(f"sync engine state has no matching {key!r} for this model: resume with the "
                                 "same sync kind, outer step and model as the checkpoint")
            for n, t in zip(self.names, tensors):
                t.copy_(sd[key][n])

    def state_bytes(self) -> dict[str, int]:
        return {"anchor": sum(a.numel() * a.element_size() for a in self.anchor),
                "outer_momentum": sum(b.numel() * b.element_size() for b in self.momentum),
                **({"compression_error": self.compressed.state_bytes()} if self.compressed is not None else {})}


class MomentAverage:
    """u <- mean_m u_m at t % K_u == 0, v <- mean_m v_m at t % K_v == 0 and Dion's buffer M <- mean_m M_m at
    t % K_M == 0 (kind "optimizer_state"), over the optimizer state keys "exp_avg" (u), "exp_avg_sq" (v) and
    "momentum" (M) of those `params` that have them; a period 0 means never."""

    KEYS = ("exp_avg", "exp_avg_sq")
    DION_BUFFER = "momentum"

    def __init__(self, optimizer: torch.optim.Optimizer, params: list[nn.Parameter], comm: Communicator,
                 every_u: int, every_v: int, every_m: int = 0):
        self.optimizer = optimizer
        self.params = params
        self.comm = comm
        self.every = {self.KEYS[0]: every_u, self.KEYS[1]: every_v, self.DION_BUFFER: every_m}

    def __call__(self, step: int) -> None:
        for key, every in self.every.items():
            if every and step % every == 0:
                state = self.optimizer.state
                self.comm.all_reduce([state[p][key] for p in self.params if key in state[p]], "optimizer_state")


class GlobalBasis:
    """Q = top-r singular vectors of a matrix that is identical on every rank (an all-reduced G, or Delta), in fp32
    with fixed signs, so Q is identical on every rank (D13); installed by the optimizer's set_bases_from (LowRankAdam
    moves the moments from the old Q to the new one, D4; Dion replaces its right factors). `params` are the
    optimizer's matrices with a basis, held in their state under `key`. Keeps, per matrix name, the largest principal
    angle between the old and the new Q at the last change of basis (subspace movement) and the step of that change."""

    def __init__(self, optimizer: torch.optim.Optimizer, comm: Communicator, names: dict[int, str],
                 params: list[nn.Parameter], key: str):
        self.optimizer = optimizer
        self.comm = comm
        self.params = params
        self.key = key
        self.names = [names[id(p)] for p in self.params]
        self.angles: dict[str, float] = {}
        self.changed_at = 0

    def missing(self) -> bool:
        """Whether some matrix has no basis yet (a fresh optimizer)."""
        return any(self.key not in self.optimizer.state[p] for p in self.params)

    def from_gradients(self, reduce: bool) -> None:
        """Q from G, all-reduced first (kind "gradient") on a copy when `reduce`, else G is already the mean."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        if reduce:
            grads = [g.detach().clone() for g in grads]
            self.comm.all_reduce(grads, "gradient")
        self.install(grads)

    def install(self, matrices: list[torch.Tensor]) -> None:
        """Q = top-r basis of the matching matrix for each of `params` (in that order), by set_bases_from."""
        old = [self.optimizer.state[p].get(self.key) for p in self.params]
        self.optimizer.set_bases_from(matrices)
        angles = {name: principal_angles(q, self.optimizer.state[p][self.key]).max().item()
                  for name, p, q in zip(self.names, self.params, old) if q is not None}
        if angles:
            self.angles = angles
            self.changed_at = self.comm.step


class DirectionProbe:
    """A measurement that leaves training unchanged: S = sum over the steps since the last sync of mean_m G_m (each
    worker's gradient before clipping, all-reduced on a copy through the probe's own Communicator, kind "probe", so
    the method's ledger never sees it); at a sync, cos(Delta, -S) over all parameters (the averaged pseudo-gradient
    against the full-batch descent direction of the same steps), then S = 0. Identical on every rank."""

    def __init__(self, params: list[nn.Parameter], comm: Communicator):
        self.params = params
        self.comm = comm
        self.total = [torch.zeros_like(p) for p in params]
        self.cosine: float | None = None
        self.measured_at = 0

    @torch.no_grad()
    def add_gradients(self) -> None:
        grads = [torch.zeros_like(p) if p.grad is None else p.grad.detach().clone() for p in self.params]
        self.comm.all_reduce(grads, "probe")
        torch._foreach_add_(self.total, grads)

    @torch.no_grad()
    def measure(self, deltas: list[torch.Tensor], step: int) -> None:
        """cos(Delta, -S) in float64 (0 where either is zero), then S = 0."""
        dot = sum(torch.dot(d.double().flatten(), s.double().flatten()) for d, s in zip(deltas, self.total))
        norms = math.sqrt(sum(d.double().square().sum() for d in deltas) *
                          sum(s.double().square().sum() for s in self.total))
        self.cosine = -float(dot) / norms if norms else 0.0
        self.measured_at = step
        for s in self.total:
            s.zero_()


class DenseBasisProbe:
    """A measurement beside a compressed sync that leaves training unchanged: the dense Delta of the basis matrices,
    all-reduced on a copy through the probe's own Communicator (kind "probe"); after the basis from the compressed
    Delta is installed, per matrix the largest principal angle between that Q and the top-r basis of the dense Delta
    (same rank and side, fp32 SVD). Identical on every rank."""

    def __init__(self, basis: GlobalBasis, comm: Communicator):
        self.basis = basis
        self.comm = comm
        self.angles: dict[str, float] = {}
        self.measured_at = 0

    @torch.no_grad()
    def reduce(self, local: list[torch.Tensor]) -> list[torch.Tensor]:
        """mean_m Delta_m of the basis matrices (in basis.params order)."""
        dense = [d.clone() for d in local]
        self.comm.all_reduce(dense, "probe")
        return dense

    @torch.no_grad()
    def measure(self, dense: list[torch.Tensor], step: int) -> None:
        state = self.basis.optimizer.state
        self.angles = {}
        for name, p, delta in zip(self.basis.names, self.basis.params, dense):
            q = state[p][self.basis.key]
            reference = top_basis(delta, q.shape[1], projection_side(p.shape))
            self.angles[name] = principal_angles(q, reference).max().item()
        self.measured_at = step


class SyncEngine:
    """The sync of one method for one replica (see the module docstring); built by `build_sync_engine`."""

    def __init__(self, opts: SyncOptions, model: nn.Module, optimizer: torch.optim.Optimizer, comm: Communicator):
        self.opts = opts
        self.optimizer = optimizer
        self.comm = comm
        self.step = 0
        kind = opts.kind
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.params = [p for _, p in named]
        lowrank_ids = {id(p) for g in lowrank_groups(optimizer) for p in g["params"]}
        lowrank = [p for p in self.params if id(p) in lowrank_ids]
        # With projected gradients the low-rank matrices travel as Q^T G through the optimizer's hook, which also
        # all-reduces the other parameters' G.
        reduced = [p for p in self.params if id(p) not in lowrank_ids] if opts.projected_gradients else self.params
        self.gradients = GradientAllReduce(reduced, comm) if kind.per_step_gradients else None
        names = {id(p): n for n, p in named}
        self.basis = None
        if kind.global_basis:
            self.basis = GlobalBasis(optimizer, comm, names, optimizer.basis_params(), optimizer.basis_key)
        self.lowrank_gradients_reduced = kind.per_step_gradients and not opts.projected_gradients
        self.pseudo = (PseudoGradientSync(named, comm, opts.outer, opts.outer_lr, opts.outer_momentum,
                                          opts.compression) if kind.k_step else None)
        self.moments = None
        if kind.k_step and (opts.state_sync_u or opts.state_sync_v or opts.state_sync_m):
            scope = lowrank if opts.state_sync_scope == "lowrank" else self.params
            self.moments = MomentAverage(optimizer, scope, comm, opts.state_sync_u, opts.state_sync_v,
                                         opts.state_sync_m)
        self.probe_comm = Communicator(comm.group) if opts.probe_cosine or opts.probe_dense_basis else None
        self.probe = DirectionProbe(self.params, self.probe_comm) if kind.k_step and opts.probe_cosine else None
        self.dense_probe = DenseBasisProbe(self.basis, self.probe_comm) if opts.probe_dense_basis else None
        if opts.projected_gradients:
            optimizer.projected_gradient_hook = self._all_reduce_projected
        if isinstance(optimizer, SynchronizesItself):
            optimizer.set_communicator(comm if kind.optimizer_synchronizes else None)

    def _all_reduce_projected(self, projected: list[torch.Tensor]) -> None:
        """Inside optimizer.step(): g <- mean_m g_m for the projected gradients g = Q^T G (kind "projected_gradient"),
        in place, and G <- mean_m G_m for the other parameters. Both come after the caller's clipping, which each
        worker does on its own gradient (its full G is never averaged), so every replica applies the same update."""
        self.comm.all_reduce(projected, "projected_gradient")
        self.gradients()

    def setup(self) -> None:
        """Once before training: every replica takes rank 0's parameters (kind "parameters"); W_anchor = W."""
        self.comm.step = 0
        self.comm.broadcast([p.detach() for p in self.params], "parameters")
        if self.pseudo is not None:
            self.pseudo.reset_anchor()

    def _enter(self, step: int) -> None:
        if isinstance(step, bool) or not isinstance(step, int) or step <= self.step:
            raise ValueError(f"step={step!r} after step {self.step}: steps count from 1 and increase by one "
                             "optimizer step at a time")
        self.comm.step = step
        if self.probe_comm is not None:
            self.probe_comm.step = step

    def before_optimizer_step(self, step: int, clip: Callable[[], None] | None = None) -> None:
        """After backward, before optimizer.step(): per-step gradient all-reduce (with projected gradients it runs
        inside optimizer.step() instead), the probe's copy of the gradient, then `clip` (the caller's gradient
        clipping), then a new global Q from the all-reduced clipped gradient when there is none yet (D1) or at a
        lowrank_ddp refresh ((t - 1) % T == 0)."""
        self._enter(step)
        if self.gradients is not None and not self.opts.projected_gradients:
            self.gradients()
        if self.probe is not None:
            self.probe.add_gradients()
        if clip is not None:
            clip()
        if self.basis is not None:
            refresh = self.opts.kind.global_basis == "gradient" and (step - 1) % self.opts.basis_refresh_every == 0
            if refresh or self.basis.missing():
                self.basis.from_gradients(reduce=not self.lowrank_gradients_reduced)

    def after_optimizer_step(self, step: int) -> None:
        """After optimizer.step(): at t % K == 0 the pseudo-gradient sync, the probe's cosine, then Q from Delta;
        moment averages."""
        self._enter(step)
        if self.pseudo is not None and step % self.opts.sync_every == 0:
            index = {id(p): i for i, p in enumerate(self.params)}
            dense = None
            if self.dense_probe is not None:
                local = self.pseudo.local_deltas()
                dense = self.dense_probe.reduce([local[index[id(p)]] for p in self.basis.params])
            deltas = self.pseudo()
            if self.probe is not None:
                self.probe.measure(deltas, step)
            if self.basis is not None and self.opts.kind.global_basis == "pseudo_gradient":
                self.basis.install([deltas[index[id(p)]] for p in self.basis.params])
            if dense is not None:
                self.dense_probe.measure(dense, step)
        if self.moments is not None:
            self.moments(step)
        self.step = step

    def before_checkpoint(self) -> None:
        """Make the optimizer state identical on every rank where the optimizer can (Dion averages its buffers)."""
        if isinstance(self.optimizer, SynchronizesItself):
            self.optimizer.synchronize_for_checkpoint()

    def is_sync_step(self, step: int) -> bool:
        """Whether all replicas hold identical weights after step `step` (a checkpoint point)."""
        return self.opts.is_sync_step(step)

    def state_dict(self) -> dict[str, Any]:
        """Tensors only: the last step taken, and for K-step methods W_anchor and the outer momentum."""
        sd: dict[str, Any] = {"step": torch.tensor(self.step)}
        if self.pseudo is not None:
            sd.update(self.pseudo.state_dict())
        return sd

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        self.step = int(sd["step"])
        if self.pseudo is not None:
            self.pseudo.load_state_dict(sd)

    def metrics(self) -> dict[str, float]:
        """Flat scalars: bytes on the wire at the last step by kind and in total so far (the probe's bytes apart, in
        comm/probe_bytes only), collective calls since the start-up broadcast, optimizer-state bytes by kind (with the
        anchor and outer momentum apart), RMS of the update terms, subspace movement (radians), and the probe's
        cosine at the step it was measured."""
        at_step = self.comm.wire_bytes_at(self.step)
        out = {f"comm/{kind}_bytes": float(at_step.get(kind, 0.0)) for kind in KINDS}
        out["comm/step_bytes"] = float(sum(at_step.values()))
        out["comm/cumulative_bytes"] = float(sum(self.comm.wire_bytes_by_kind().values()))
        records = self.comm.records
        setup = next((i for i, r in enumerate(records) if r.step > 0), len(records))  # step 0: the start-up broadcast
        out["comm/training_collectives"] = float(len(records) - setup)
        if self.probe_comm is not None:
            out["comm/probe_bytes"] = float(sum(self.probe_comm.wire_bytes_at(self.step).values()))
        if self.probe is not None and self.probe.measured_at == self.step and self.probe.cosine is not None:
            out["probe/pseudo_gradient_cosine"] = self.probe.cosine
        if self.dense_probe is not None and self.dense_probe.measured_at == self.step:
            out["probe/dense_basis_max_angle"] = max(self.dense_probe.angles.values())
            out["probe/dense_basis_mean_angle"] = sum(self.dense_probe.angles.values()) / len(self.dense_probe.angles)
        for kind, n in optimizer_state_bytes(self.optimizer).items():
            out[f"memory/{kind}_bytes"] = float(n)
        if self.pseudo is not None:
            for kind, n in self.pseudo.state_bytes().items():
                out[f"memory/{kind}_bytes"] = float(n)
        if isinstance(self.optimizer, ReportsUpdateRMS):
            for term, rms in self.optimizer.last_update_rms().items():
                out[f"update_rms/{term}"] = float(rms)
        if self.basis is not None and self.basis.angles and self.basis.changed_at == self.step:
            angles = self.basis.angles
            out["subspace/max_angle"] = max(angles.values())
            out["subspace/mean_angle"] = sum(angles.values()) / len(angles)
            out.update({f"subspace/angle/{name}": angle for name, angle in angles.items()})
        return out

    def basis_changed(self, step: int) -> bool:
        """Whether a global basis with a measured subspace movement was installed at `step`."""
        return self.basis is not None and bool(self.basis.angles) and self.basis.changed_at == step


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes of optimizer state by kind: the optimizer's own `state_bytes()` where it has one; else Adam moments
    (exp_avg, exp_avg_sq) as "adamw_moments" and any other tensor state by its key, step counters excluded."""
    if isinstance(optimizer, CountsStateBytes):
        return dict(optimizer.state_bytes())
    totals: dict[str, int] = {}
    for state in optimizer.state.values():
        for key, t in state.items():
            if torch.is_tensor(t) and key != "step":
                kind = "adamw_moments" if key in MomentAverage.KEYS else key
                totals[kind] = totals.get(kind, 0) + t.numel() * t.element_size()
    return totals


def check_optimizer(opts: SyncOptions, optimizer: torch.optim.Optimizer) -> None:
    """ValueError unless the optimizer fits the method (every difference a field of `Method`): self-synchronizing
    optimizers only where the method lets the optimizer synchronize, or the Dion family run locally by the local Dion
    methods (fixed-rank Orth-Dion where the engine installs a shared Q); a LowRankAdam with the basis the method
    needs ("external" exactly where a global Q is installed; "local" refreshed at every sync where the method says so,
    D10); omega == 1 where the method has no full-rank term or that term would use unsynchronized gradients (projected
    gradients); no averaging of moments kept in worker-local bases, nor of Dion buffers an optimizer does not have.
    (LowRankAdam itself rejects a rank larger than a matrix when it is built.)"""
    name, kind = opts.name, opts.kind
    self_syncing = isinstance(optimizer, SynchronizesItself)
    dion = dion_groups(optimizer)
    syncing_kinds = sorted(n for n, m in SYNC_KINDS.items() if m.optimizer_synchronizes)
    if kind.local_dion:
        _check_local_dion(name, kind, optimizer, dion)
    elif kind.optimizer_synchronizes and not self_syncing:
        raise ValueError(f"sync.name={name!r} needs an optimizer that synchronizes itself (Dion, Orth-Dion); "
                         f"{type(optimizer).__name__} does not: use sync.name='ddp' or a K-step method")
    elif not kind.optimizer_synchronizes and self_syncing:
        raise ValueError(f"{type(optimizer).__name__} synchronizes its own gradients: use sync.name="
                         f"{' or '.join(map(repr, syncing_kinds))} (or run it locally with sync.name="
                         f"{' or '.join(repr(n) for n, m in SYNC_KINDS.items() if m.local_dion)})")
    if kind.k_step and opts.state_sync_m and not dion:
        raise ValueError(f"sync.state_sync_m={opts.state_sync_m} averages Dion's buffers M, but "
                         f"{type(optimizer).__name__} has none: set sync.state_sync_m=0")
    groups = lowrank_groups(optimizer)
    if kind.optimizer_basis and not (groups and isinstance(optimizer, CarriesBasis)):
        raise ValueError(f"sync.name={name!r} needs a low-rank optimizer (LowRankAdam with basis="
                         f"{kind.optimizer_basis!r}); {type(optimizer).__name__} has no low-rank parameter groups")
    for g in groups:
        basis = g.get("basis")
        if kind.optimizer_basis and basis != kind.optimizer_basis:
            raise ValueError(f"sync.name={name!r} needs the low-rank groups' basis={kind.optimizer_basis!r}, "
                             f"got basis={basis!r}: set optim.basis={kind.optimizer_basis!r}")
        if not kind.global_basis and basis == "external":
            raise ValueError(f"low-rank groups with basis='external' get Q only from a global-basis method "
                             f"({', '.join(n for n, m in SYNC_KINDS.items() if m.optimizer_basis == 'external')}), "
                             f"not sync.name={name!r}: set optim.basis='local'")
        if (not kind.full_rank_term or opts.projected_gradients) and g.get("omega") != 1:
            why = ("is defined without the full-rank term" if not kind.full_rank_term else
                   "with projected gradients cannot synchronize the full-rank term, which uses the local G")
            raise ValueError(f"sync.name={name!r} {why}: set optim.omega=1 (got {g.get('omega')!r})")
        if kind.basis_refresh_at_sync and g.get("refresh_every") != opts.sync_every:
            raise ValueError(f"sync.name={name!r} refreshes each worker's Q at every sync (D10): set "
                             f"optim.refresh_every equal to sync.sync_every={opts.sync_every} "
                             f"(got {g.get('refresh_every')!r})")
    if kind.k_step and (opts.state_sync_u or opts.state_sync_v or opts.state_sync_m):
        if opts.state_sync_scope == "lowrank" and not groups:
            raise ValueError(f"sync.state_sync_scope='lowrank' averages low-rank moments, but "
                             f"{type(optimizer).__name__} has none: set sync.state_sync_scope='all' or use a low-rank "
                             "optimizer")
        if any(g.get("basis") == "local" for g in groups):
            raise ValueError(f"sync.name={name!r} would average low-rank moments that live in each worker's own "
                             "basis (basis='local'), which is meaningless: set sync.state_sync_u=0 and "
                             "sync.state_sync_v=0")


def _check_local_dion(name: str, kind: SyncKind, optimizer: torch.optim.Optimizer, dion: list[dict]) -> None:
    if not dion:
        raise ValueError(f"sync.name={name!r} runs the Dion family locally between syncs; {type(optimizer).__name__} "
                         "has no Dion matrices: set optim.name='orth_dion'")
    if kind.global_basis and any(g["normalization"] != "qr" or g["adaptive_rank"] for g in dion):
        raise ValueError(f"sync.name={name!r} gives every worker the same orthonormal right factor Q of a fixed rank: "
                         "it needs fixed-rank Orth-Dion: set optim.name='orth_dion'")


def build_sync_engine(opts: SyncOptions, model: nn.Module, optimizer: torch.optim.Optimizer,
                      comm: Communicator) -> SyncEngine:
    """The engine of the parsed sync options (lowcomm.distributed.options.sync_options) for this replica; ValueError
    before training on an optimizer that does not fit the method."""
    check_optimizer(opts, optimizer)
    return SyncEngine(opts, model, optimizer, comm)
