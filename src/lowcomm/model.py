"""A decoder-only transformer: token embedding, RoPE, RMSNorm, causal attention, MLP, no biases.

x_0 = E[tokens];  x_{l+1/2} = x_l + Attn(RMSNorm(x_l));  x_{l+1} = x_{l+1/2} + MLP(RMSNorm(x_{l+1/2}))
logits = RMSNorm(x_L) @ E^T (tied) or @ W_out^T (untied).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 4096
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    mlp: str = "gelu"  # "gelu" (non-gated, d_hidden = 4 d) or "swiglu"
    d_hidden: int | None = None  # default 4 * d_model
    max_context: int = 128
    tied_embeddings: bool = True
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-6

    @property
    def hidden(self) -> int:
        return self.d_hidden if self.d_hidden is not None else 4 * self.d_model

    def validate(self) -> None:
        for key in ("vocab_size", "d_model", "n_layers", "n_heads", "max_context"):
            if getattr(self, key) < 1:
                raise ValueError(f"model.{key}={getattr(self, key)} must be >= 1")
        if self.mlp not in ("gelu", "swiglu"):
            raise ValueError(f"model.mlp={self.mlp!r} is unknown: use 'gelu' or 'swiglu'")
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise ValueError(
                f"model.d_model={self.d_model} must split into n_heads={self.n_heads} heads of even size"
            )


# Named sizes. The paper sizes (lordo-*, gpt2-45m, llama3-320m) follow the papers (LoRDO arXiv 2602.04396,
# Orth-Dion arXiv 2605.16341); they are configured here, but on CPU only their parameter counts are computed (meta
# device).
SIZES: dict[str, ModelConfig] = {
    "smoke": ModelConfig(vocab_size=512, d_model=64, n_layers=2, n_heads=2, max_context=64),
    "cpu": ModelConfig(vocab_size=4096, d_model=128, n_layers=4, n_heads=4, max_context=128),
    "lordo-16m": ModelConfig(vocab_size=50_368, d_model=256, n_layers=4, n_heads=4, max_context=2048),
    "lordo-125m": ModelConfig(vocab_size=50_368, d_model=768, n_layers=12, n_heads=12, max_context=2048),
    "lordo-720m": ModelConfig(vocab_size=50_368, d_model=2048, n_layers=12, n_heads=16, max_context=2048),
    "gpt2-45m": ModelConfig(vocab_size=50_257, d_model=512, n_layers=6, n_heads=8, max_context=1024),
    "llama3-320m": ModelConfig(
        vocab_size=128_256, d_model=768, n_layers=18, n_heads=12, mlp="swiglu", d_hidden=2048,
        max_context=2048, tied_embeddings=False, rope_theta=500_000.0,
    ),
}


def model_config_from(section) -> ModelConfig:
    """The ModelConfig of a config's `model` section: its named `size` with the section's non-None overrides."""
    overrides = {k: v for k, v in dict(section).items() if k != "size"}
    return model_config(section["size"], **overrides)


def model_config(size: str, **overrides) -> ModelConfig:
    """The named size `size` with any field replaced by `overrides` (None values are ignored)."""
    if size not in SIZES:
        raise ValueError(f"model.size={size!r} is unknown: choose one of {sorted(SIZES)}")
    cfg = replace(SIZES[size], **{k: v for k, v in overrides.items() if v is not None})
    cfg.validate()
    return cfg


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * g."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rope_tables(head_dim: int, context: int, theta: float, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of angle t * theta^(-2i/head_dim), shape (context, head_dim / 2)."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(context, device=device, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each pair (x_2i, x_2i+1) of x (batch, heads, T, head_dim) by the position's angle."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    rotated = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return rotated.flatten(-2).type_as(x)


class CausalSelfAttention(nn.Module):
    """Separate d x d projections q, k, v (the matrices a low-rank or spectral optimizer treats one by one)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.q = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.k = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.v = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, T, d) -> (batch, heads, T, head_dim)."""
        b, t, d = x.shape
        return x.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self._heads(self.q(x)), self._heads(self.k(x)), self._heads(self.v(x))
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    """gelu: W_2 gelu(W_1 x);  swiglu: W_2 (silu(W_gate x) * W_1 x)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gated = cfg.mlp == "swiglu"
        self.up = nn.Linear(cfg.d_model, cfg.hidden, bias=False)
        self.gate = nn.Linear(cfg.d_model, cfg.hidden, bias=False) if self.gated else None
        self.down = nn.Linear(cfg.hidden, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.silu(self.gate(x)) * self.up(x) if self.gated else F.gelu(self.up(x))
        return self.down(h)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = CausalSelfAttention(cfg)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = None if cfg.tied_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        cos, sin = rope_tables(cfg.d_model // cfg.n_heads, cfg.max_context, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.apply(self._init_weights)
        # GPT-2 scaling: residual projections shrink with depth.
        for name, p in self.named_parameters():
            if name.endswith(("attn.proj.weight", "mlp.down.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.n_layers))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits (batch, T, vocab) for tokens (batch, T), T <= max_context."""
        t = tokens.shape[1]
        if t > self.cfg.max_context:
            raise ValueError(
                f"sequence length {t} exceeds the model's max_context={self.cfg.max_context}: "
                "lower data.context or raise model.max_context"
            )
        x = self.embed(tokens)
        cos, sin = self.rope_cos[:t], self.rope_sin[:t]
        for block in self.blocks:
            x = block(x, cos, sin)
        x = self.norm(x)
        head = self.embed.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(x, head)

    def loss(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy."""
        logits = self(tokens)
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())

    def hidden_matrices(self) -> list[tuple[str, nn.Parameter]]:
        """The 2-D weights of attention and MLP: the matrices low-rank and spectral optimizers treat."""
        return [(n, p) for n, p in self.named_parameters() if p.ndim == 2 and n.startswith("blocks.")]


def parameter_count(cfg: ModelConfig) -> int:
    """Number of parameters of a model of this configuration, built on the meta device (no memory)."""
    with torch.device("meta"):
        model = Transformer(cfg)
    return sum(p.numel() for p in model.parameters())


def describe(cfg: ModelConfig) -> dict:
    return {**asdict(cfg), "parameters": parameter_count(cfg)}
