"""Sync options: one dataclass of the `sync` section's keys, and a table saying what each sync kind (`sync.name`)
runs.

Every sync kind is the same engine with different parts switched on (the methods of docs/methods.md):
per-step gradient all-reduce, a global low-rank basis Q, the K-step pseudo-gradient sync
Delta = mean_m(W_m - W_anchor), and averaging of optimizer moments every K_u / K_v steps (Dion's buffers M
every K_M steps).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from lowcomm.distributed.compression import BITS, MAX_CHUNK, ROUNDINGS, Compression


@dataclass(frozen=True)
class SyncKind:
    """The parts a sync kind (`sync.name`) runs.

    per_step_gradients: gradients all-reduced every step (the low-rank matrices' as projections Q^T G
        when `lowrank_gradient="projected"` on a method with a gradient basis).
    k_step: the pseudo-gradient sync every K steps.
    global_basis: where the shared Q comes from: "gradient" (all-reduced G, refreshed every T steps),
        "pseudo_gradient" (Delta at each sync, all-reduced G of the first step before that: D1), or None.
    optimizer_basis: the LowRankAdam `basis` option the method needs ("external": the engine installs Q;
        "local": the optimizer computes its own), or None for any optimizer without an external basis.
    local_dion: the optimizer is the Dion family run locally, without its Communicator (its buffers M
        averaged every K_M steps); with global_basis="pseudo_gradient" the engine installs its right factors Q.
    optimizer_synchronizes: the optimizer all-reduces what it needs itself (the Dion family with its Communicator);
        the engine only broadcasts the start-up parameters.
    outer: default outer step of the K-step sync.
    state_scope: default parameters whose moments are averaged ("all" | "lowrank").
    state_sync_default: whether moments are averaged by default (period K) or never (0).
    full_rank_term: whether the low-rank optimizer may keep its full-rank quasi-hyperbolic term (omega < 1);
        False: the method is defined without it (omega = 1).
    basis_refresh_at_sync: each worker's own basis is refreshed at every sync (refresh_every = K, D10).
    """

    per_step_gradients: bool = False
    k_step: bool = False
    global_basis: str | None = None
    optimizer_basis: str | None = None
    optimizer_synchronizes: bool = False
    outer: str = "average"
    state_scope: str = "all"
    state_sync_default: bool = False
    local_dion: bool = False
    full_rank_term: bool = True
    basis_refresh_at_sync: bool = False


SYNC_KINDS: dict[str, SyncKind] = {
    "ddp": SyncKind(per_step_gradients=True),
    "lowrank_ddp": SyncKind(per_step_gradients=True, global_basis="gradient", optimizer_basis="external"),
    "local_adam": SyncKind(k_step=True, state_sync_default=True),
    "diloco": SyncKind(k_step=True, outer="nesterov"),
    "lordo": SyncKind(k_step=True, global_basis="pseudo_gradient", optimizer_basis="external",
                    state_scope="lowrank", state_sync_default=True),
    "lordo_global_noqh": SyncKind(k_step=True, global_basis="pseudo_gradient", optimizer_basis="external",
                                state_scope="lowrank", state_sync_default=True, full_rank_term=False),
    "lordo_local": SyncKind(k_step=True, optimizer_basis="local", state_scope="lowrank", basis_refresh_at_sync=True),
    "optimizer_sync": SyncKind(optimizer_synchronizes=True),
    "orth_dion_local": SyncKind(k_step=True, local_dion=True),
    "lordo_orth_dion": SyncKind(k_step=True, global_basis="pseudo_gradient", local_dion=True),
}

OUTER_STEPS = ("average", "nesterov")
STATE_SCOPES = ("all", "lowrank")
LOWRANK_GRADIENTS = ("projected", "full")


@dataclass(frozen=True)
class SyncOptions:
    """Config keys of the `sync` section. None means "the method's default" (see SYNC_KINDS); keys a method does
    not use are accepted and ignored, so one base config can serve every method.

    sync_every: K; the pseudo-gradient sync runs after the local step at t % K == 0, t counted from 1 (D12).
    outer: "average" (W = W_anchor + Delta, D2) or "nesterov" (SGD with Nesterov momentum on -Delta, as DiLoCo).
    outer_lr, outer_momentum: the Nesterov outer step's learning rate and momentum (unused by "average").
    state_sync_u, state_sync_v: K_u, K_v; first / second moments averaged at t % K_u == 0 (0: never). Default K
        for local_adam and the global LoRDO variants (D8), never for diloco and lordo_local (whose moments live in
        each worker's own basis) and the local Dion methods.
    state_sync_scope: "all" parameters' moments, or only the low-rank matrices' u, v ("lowrank", LoRDO default).
    state_sync_m: K_M; the Dion buffers M averaged at t % K_M == 0 (0: never). Default K for the local Dion methods
        (orth_dion_local, lordo_orth_dion), 0 for the others.
    basis_refresh_every: T of lowrank_ddp; Q is recomputed at steps t with (t - 1) % T == 0.
    lowrank_gradient: what lowrank_ddp all-reduces every step: "projected" (Q^T G, D9) or "full" (G).
    probe_cosine: K-step methods: also sum the all-reduced gradient of every step over the K steps (on a separate
        ledger, kind "probe") and log at each sync the cosine between Delta and the negative of that sum.
    compress: K-step methods: send the pseudo-gradient compressed (lowcomm.distributed.compression): per-worker
        error feedback decayed by compress_ef_beta, the compress_density share of each chunk of compress_chunk
        entries with the largest |e|, values at compress_bits bits (2, 4, 8; 32: fp32) rounded compress_rounding.
    probe_dense_basis: with compress and a low-rank basis from the pseudo-gradient (lordo, lordo_global_noqh): at
        each sync also all-reduce the dense Delta of the low-rank matrices on a copy (a separate ledger, kind
        "probe") and log the largest principal angle between the installed Q (from the compressed Delta) and the
        top-r basis of the dense Delta.
    """

    name: str
    sync_every: int = 32
    outer: str | None = None
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    state_sync_u: int | None = None
    state_sync_v: int | None = None
    state_sync_scope: str | None = None
    state_sync_m: int | None = None
    basis_refresh_every: int = 200
    lowrank_gradient: str = "projected"
    probe_cosine: bool = False
    probe_dense_basis: bool = False
    compress: bool = False
    compress_density: float = 0.01
    compress_bits: int = 2
    compress_chunk: int = 4096
    compress_rounding: str = "nearest"
    compress_ef_beta: float = 0.95

    @property
    def kind(self) -> SyncKind:
        return SYNC_KINDS[self.name]

    @property
    def compression(self) -> Compression | None:
        """The pseudo-gradient compression, or None (dense all-reduce)."""
        if not self.compress:
            return None
        return Compression(self.compress_density, self.compress_bits, self.compress_chunk, self.compress_rounding,
                           self.compress_ef_beta)

    @property
    def projected_gradients(self) -> bool:
        """Whether the low-rank matrices' gradients travel as projections Q^T G every step."""
        return self.kind.global_basis == "gradient" and self.lowrank_gradient == "projected"

    def uses(self, key: str) -> bool:
        """Whether the resolved options act on the `sync` key `key`: the outer lr and momentum only under the
        "nesterov" outer step, K only on K-step kinds; every other key as given."""
        if key in ("outer_lr", "outer_momentum"):
            return self.outer == "nesterov"
        return self.kind.k_step if key == "sync_every" else True

    def is_sync_step(self, step: int) -> bool:
        """Whether replicas hold identical weights after step `step`: every step for per-step methods, t % K == 0
        for K-step methods."""
        return not self.kind.k_step or step % self.sync_every == 0


def _check_choice(key: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"sync.{key}={value!r} is unknown: use one of {list(choices)}")


def _check_int(key: str, value: Any, minimum: int, meaning: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"sync.{key}={value!r} is invalid: set an integer >= {minimum} ({meaning})")


def sync_options(cfg: Mapping[str, Any]) -> SyncOptions:
    """SyncOptions from the `sync` config section, with the method's defaults filled in; ValueError naming the
    key on an unknown name or key or an out-of-range value."""
    cfg = dict(cfg)
    name = cfg.get("name")
    if name not in SYNC_KINDS:
        raise ValueError(f"sync.name={name!r} is not a sync kind: choose one of {sorted(SYNC_KINDS)}")
    fields = {f.name for f in dataclasses.fields(SyncOptions)}
    unknown = sorted(set(cfg) - fields)
    if unknown:
        raise ValueError(f"unknown key(s) sync.{', sync.'.join(unknown)} for sync kind {name!r}: "
                         f"valid keys are {sorted(fields)}")
    kind = SYNC_KINDS[name]
    opts = SyncOptions(**cfg)
    _check_int("sync_every", opts.sync_every, 1, "K, the number of local steps between syncs")
    _check_int("basis_refresh_every", opts.basis_refresh_every, 1, "T, steps between basis refreshes")
    state_default = opts.sync_every if kind.state_sync_default else 0
    opts = dataclasses.replace(
        opts,
        outer=kind.outer if opts.outer is None else opts.outer,
        state_sync_u=state_default if opts.state_sync_u is None else opts.state_sync_u,
        state_sync_v=state_default if opts.state_sync_v is None else opts.state_sync_v,
        state_sync_scope=kind.state_scope if opts.state_sync_scope is None else opts.state_sync_scope,
        state_sync_m=(opts.sync_every if kind.local_dion else 0) if opts.state_sync_m is None else opts.state_sync_m,
    )
    _check_choice("outer", opts.outer, OUTER_STEPS)
    _check_choice("lowrank_gradient", opts.lowrank_gradient, LOWRANK_GRADIENTS)
    _check_int("state_sync_u", opts.state_sync_u, 0, "K_u, steps between first-moment averages; 0 = never")
    _check_int("state_sync_v", opts.state_sync_v, 0, "K_v, steps between second-moment averages; 0 = never")
    _check_int("state_sync_m", opts.state_sync_m, 0, "K_M, steps between averages of Dion's buffers; 0 = never")
    for key in ("probe_cosine", "probe_dense_basis"):
        if not isinstance(getattr(opts, key), bool):
            raise ValueError(f"sync.{key}={getattr(opts, key)!r} is invalid: set true or false")
    if opts.probe_dense_basis and not (opts.compress and opts.kind.global_basis == "pseudo_gradient"
                                       and not opts.kind.local_dion):
        raise ValueError(f"sync.probe_dense_basis=true compares the basis of a compressed pseudo-gradient with the "
                         f"dense one, which sync.name={opts.name!r} with compress={opts.compress} has not: use it with "
                         "sync.compress=true on lordo or lordo_global_noqh")
    if not opts.outer_lr > 0:
        raise ValueError(f"sync.outer_lr={opts.outer_lr!r} is invalid: set a positive outer learning rate")
    if not 0 <= opts.outer_momentum < 1:
        raise ValueError(f"sync.outer_momentum={opts.outer_momentum!r} is invalid: set a value in [0, 1)")
    _check_choice("state_sync_scope", opts.state_sync_scope, STATE_SCOPES)
    if opts.compress:
        check_compression(opts)
    return opts


def check_compression(opts: SyncOptions) -> None:
    """ValueError naming the sync.compress_* key out of range, or compress on a method without a pseudo-gradient."""
    if not opts.kind.k_step:
        raise ValueError(f"sync.compress=true compresses the pseudo-gradient, which sync.name={opts.name!r} does not "
                         "send: use a K-step method (diloco, local_adam, lordo, lordo_local, orth_dion_local, ...)")
    if not 0 < opts.compress_density <= 1:
        raise ValueError(f"sync.compress_density={opts.compress_density!r} is invalid: set a share in (0, 1]")
    if opts.compress_bits not in BITS:
        raise ValueError(f"sync.compress_bits={opts.compress_bits!r} is invalid: use one of {list(BITS)}")
    _check_int("compress_chunk", opts.compress_chunk, 1, "entries per chunk")
    if opts.compress_chunk > MAX_CHUNK:
        raise ValueError(f"sync.compress_chunk={opts.compress_chunk} is invalid: at most {MAX_CHUNK} (int16 offsets)")
    _check_choice("compress_rounding", opts.compress_rounding, ROUNDINGS)
    if not 0 <= opts.compress_ef_beta <= 1:
        raise ValueError(f"sync.compress_ef_beta={opts.compress_ef_beta!r} is invalid: set a value in [0, 1]")
