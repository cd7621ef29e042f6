"""Muon baseline: Muon on the hidden matrices, torch.optim.AdamW on the other parameters.

Muon (torch.optim.Muon's arithmetic): B <- mu B + (1 - mu) G;  O = NS_5((1 - mu) G + mu B) (Nesterov; else NS_5(B));
X <- (1 - lr wd) X - lr' O with lr' = lr sqrt(max(1, m/n)). This momentum is (1 - mu) times the sum form
B <- mu B + G, G + mu B, and NS_5 is scale-free, so O is the same. NS_5 runs in `ns_dtype`: bfloat16 (the default,
bit for bit torch.optim.Muon), float32, or auto (float32 on CPU, bfloat16 on GPUs); its products by `ns_matmul`:
torch's kernels, or fp32_accumulate (bfloat16 operands multiplied and summed in float32, rounded once: the arithmetic
of torch's bfloat16 kernels in another summation order, 18-34x faster where the CPU has no native bfloat16), or auto
(fp32_accumulate there, torch elsewhere). Muon is the full-rank (r = min(m, n)) reference of Orth-Dion. It does not
synchronize itself: use it with an ordinary gradient all-reduce.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, fields

import torch

from lowcomm.optim.adamw import AdamWPart, check_adamw_options
from lowcomm.optim.groups import param_groups
from lowcomm.optim.registry import register, require

ADJUST_LR_FNS = ("original", "match_rms_adamw")
NS_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
NS_MATMULS = ("auto", "torch", "fp32_accumulate")
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # torch.optim.Muon's quintic (a, b, c)
NS_EPS = 1e-7  # torch.optim.Muon's floor of ||M||_F


def ns_dtype_on(choice: str, device: torch.device) -> torch.dtype:
    """The dtype NS_5 runs in: `choice`, or for "auto" float32 on CPU and bfloat16 on an accelerator."""
    if choice == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    return NS_DTYPES[choice]


@functools.cache
def native_bfloat16() -> bool:
    """Whether this CPU multiplies bfloat16 matrices in hardware (oneDNN's bfloat16 kernels: AVX-512 or AMX on x86);
    elsewhere torch's bfloat16 matmul falls back to a scalar loop. False where torch was built without oneDNN. Asked
    once per process (each Muon step reads it)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def ns_matmul_on(choice: str, dtype: torch.dtype, device: torch.device) -> str:
    """How NS_5 multiplies: `choice`, or for "auto" fp32_accumulate where torch's kernel would be the scalar
    fallback (bfloat16 on a CPU without native bfloat16), else torch."""
    if choice == "auto":
        fallback = dtype == torch.bfloat16 and device.type == "cpu" and not native_bfloat16()
        return "fp32_accumulate" if fallback else "torch"
    return choice


def accumulated_in_float32(op, *operands: torch.Tensor, **scales: float) -> torch.Tensor:
    """op(*operands) (torch.mm or torch.addmm) of low-precision operands computed in float32 and rounded once to their
    dtype: the arithmetic of torch's bfloat16 kernels (float32 accumulation, one rounding), in the float32 kernel's
    summation order."""
    return op(*(t.float() for t in operands), **scales).to(operands[0].dtype)


def newton_schulz(matrix: torch.Tensor, steps: int, coefficients: tuple[float, float, float], eps: float,
                  dtype: torch.dtype, matmul: str = "torch") -> torch.Tensor:
    """O = NS_k(M): X_0 = M / max(||M||_F, eps) (M^T where M is tall), then k times X <- a X + (b A + c A^2) X with
    A = X X^T, in `dtype`; torch.optim.Muon's operations in its order, the products by torch's kernels or (`matmul`
    fp32_accumulate) accumulated_in_float32."""
    a, b, c = coefficients

    def product(op, *operands: torch.Tensor, **scales: float) -> torch.Tensor:
        if matmul == "fp32_accumulate":
            return accumulated_in_float32(op, *operands, **scales)
        return op(*operands, **scales)

    x = matrix.to(dtype)
    tall = matrix.size(0) > matrix.size(1)
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=eps)
    for _ in range(steps):
        gram = product(torch.mm, x, x.T)
        x = product(torch.addmm, x, product(torch.addmm, gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


def adjusted_lr(lr: float, adjust_lr_fn: str | None, shape: torch.Size) -> float:
    """lr' = lr sqrt(max(1, A/B)) ("original", the default) or lr 0.2 sqrt(max(A, B)) ("match_rms_adamw")."""
    rows, cols = shape[:2]
    ratio = 0.2 * math.sqrt(max(rows, cols)) if adjust_lr_fn == "match_rms_adamw" else math.sqrt(max(1, rows / cols))
    return lr * ratio


class MuonAdamW(torch.optim.Optimizer):
    """One optimizer over groups routed by `algorithm`: "muon" groups step with Muon (torch.optim.Muon's group keys
    and `momentum_buffer` state, NS_5 in `ns_dtype`), "adamw" groups with torch.optim.AdamW (lr `adamw_lr`, or
    `lr`). Both share this optimizer's group dicts and state, so schedulers, state_dict() and load_state_dict() see
    one optimizer."""

    def __init__(self, params, lr: float = 0.02, momentum: float = 0.95, nesterov: bool = True, ns_steps: int = 5,
                 adjust_lr_fn: str | None = None, weight_decay: float = 0.01, adamw_lr: float | None = None,
                 betas: tuple[float, float] = (0.9, 0.95), eps: float = 1e-8, ns_dtype: str = "bfloat16",
                 ns_matmul: str = "auto"):
        groups = [dict(g) for g in params]
        unknown = sorted({g.get("algorithm") for g in groups} - {"muon", "adamw"})
        if unknown:
            raise ValueError(f"MuonAdamW: param groups need algorithm 'muon' or 'adamw', got {unknown}")
        muon_defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                             ns_coefficients=NS_COEFFICIENTS, eps=NS_EPS, ns_steps=ns_steps,
                             adjust_lr_fn=adjust_lr_fn)
        for group in groups:
            if group["algorithm"] == "muon":
                if any(p.ndim != 2 for p in group["params"]):
                    raise ValueError("MuonAdamW: a 'muon' group holds only 2-D parameters")
                for key, value in muon_defaults.items():
                    group.setdefault(key, value)
        super().__init__(groups, {})
        self.ns_dtype = ns_dtype
        self.ns_matmul = ns_matmul
        self._adamw = AdamWPart(self, lr=lr if adamw_lr is None else adamw_lr, betas=tuple(betas), eps=eps,
                                weight_decay=weight_decay)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if group["algorithm"] == "muon":
                self._muon_step(group)
        self._adamw.step()
        return loss

    def _muon_step(self, group: dict) -> None:
        """One Muon step of the group's parameters that have gradients (the module docstring's update)."""
        lr, mu = float(group["lr"]), group["momentum"]
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p.grad)
            buf = state["momentum_buffer"]
            buf.lerp_(p.grad, 1 - mu)
            update = p.grad.lerp(buf, mu) if group["nesterov"] else buf
            dtype = ns_dtype_on(self.ns_dtype, p.device)
            o = newton_schulz(update, group["ns_steps"], group["ns_coefficients"], group["eps"], dtype,
                              ns_matmul_on(self.ns_matmul, dtype, p.device))
            p.mul_(1 - lr * group["weight_decay"])
            p.add_(o, alpha=-adjusted_lr(lr, group["adjust_lr_fn"], p.shape))


@dataclass(frozen=True)
class MuonOptions:
    lr: float = 0.02
    momentum: float = 0.95
    nesterov: bool = True
    ns_steps: int = 5
    adjust_lr_fn: str | None = None
    weight_decay: float = 0.01
    adamw_lr: float | None = None
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    # the dtype of NS_5: bfloat16 (torch.optim.Muon's, what stored runs used), float32, or auto (float32 on CPU,
    # bfloat16 on GPUs)
    ns_dtype: str = "bfloat16"
    # NS_5's products: torch (its kernels: bit for bit torch.optim.Muon), fp32_accumulate (float32 products of the
    # ns_dtype operands, rounded once), or auto (fp32_accumulate where torch's bfloat16 kernel is the scalar fallback)
    ns_matmul: str = "auto"

    def __post_init__(self) -> None:
        """What torch.optim.Muon and AdamW reject, as `optim.<key>` errors (momentum >= 0, a known adjust_lr_fn), and
        an unknown ns_dtype or ns_matmul."""
        check_adamw_options(self)
        require(self.momentum >= 0, f"optim.momentum={self.momentum} is invalid: use momentum >= 0")
        require(self.ns_steps >= 1, f"optim.ns_steps={self.ns_steps} is invalid: use an integer >= 1")
        require(self.adjust_lr_fn is None or self.adjust_lr_fn in ADJUST_LR_FNS,
                f"optim.adjust_lr_fn={self.adjust_lr_fn!r} is invalid: use one of {ADJUST_LR_FNS} or null")
        require(self.ns_dtype in ("auto", *NS_DTYPES),
                f"optim.ns_dtype={self.ns_dtype!r} is invalid: use one of {('auto', *NS_DTYPES)}")
        require(self.ns_matmul in NS_MATMULS,
                f"optim.ns_matmul={self.ns_matmul!r} is invalid: use one of {NS_MATMULS}")


@register("muon", MuonOptions)
def build_muon(opts: MuonOptions, model) -> MuonAdamW:
    options = {f.name: getattr(opts, f.name) for f in fields(opts)}
    return MuonAdamW(param_groups(model, "muon", opts.weight_decay), **options)
