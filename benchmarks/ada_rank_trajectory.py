"""Ada-Orth-Dion's rank controller on synthetic buffers: r_min, r_cap, the rank over 50 steps and the active rank
share, for matrices whose gradient has a fast-decaying spectrum (sigma_i = 0.5^i, effective rank about 3) for 25
steps and a slowly decaying one (sigma_i = 0.97^i) after.

    .venv/bin/python benchmarks/ada_rank_trajectory.py
"""

import torch

from lowcomm.optim import Dion
from lowcomm.optim.dion import rank_bounds

CASES = (((200, 100), 0.3), ((80, 80), 0.25), ((64, 64), 0.25), ((64, 64), 0.5))
STEPS, SWITCH, R_MIN = 50, 25, 16


def trajectory(shape: tuple[int, int], fraction: float) -> tuple[list[int], list[float]]:
    torch.manual_seed(0)
    x = torch.nn.Parameter(torch.randn(*shape))
    opt = Dion([dict(params=[x], names=["w"])], normalization="qr", adaptive_rank=True, rank_fraction=fraction,
               r_min=R_MIN)
    generator = torch.Generator().manual_seed(0)
    k = min(shape)
    u, _ = torch.linalg.qr(torch.randn(shape[0], k, generator=generator))
    v, _ = torch.linalg.qr(torch.randn(shape[1], k, generator=generator))
    ranks, shares = [], []
    for t in range(STEPS):
        spectrum = (0.5 if t < SWITCH else 0.97) ** torch.arange(k, dtype=torch.float32)
        x.grad = u @ torch.diag(spectrum) @ v.T
        opt.step()
        ranks.append(opt.state[x]["Q"].shape[1])
        shares.append(opt.spectral_stats()["active_rank_share"])
    return ranks, shares


def main() -> None:
    for shape, fraction in CASES:
        low, cap = rank_bounds(fraction, R_MIN, *shape)
        ranks, shares = trajectory(shape, fraction)
        print(f"{shape[0]}x{shape[1]} rank_fraction {fraction}: r_min {low}, r_cap {cap}")
        print(f"  rank per step: {ranks}")
        print(f"  active rank share: mean over {STEPS} steps {sum(shares) / len(shares):.3f}, final {shares[-1]:.3f}")


if __name__ == "__main__":
    main()
