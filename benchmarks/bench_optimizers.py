"""Optimizer-step time of every optimizer in the registry on the hidden matrices of one layer of lordo-16m,
lordo-125m and llama3-320m (every layer has the same shapes), as ratios to torch's foreach AdamW.

Gradients are fixed; `optimizer.step()` alone is timed, the optimizers taking turns within each repeat (medians
after warm-up steps), each at its default rank (low-rank Adam family r = d/8, Dion family r = d/4). One thread by
default; LoRDO's step without its update-term norms (training measures them on logged steps only); Orth-Dion also
with qr_method=cholesky_qr, Muon also with ns_dtype=float32 (its default: bfloat16). Beside
them, `lordo_projections`: the three rank-r products that LoRDO's local step cannot avoid (g = Q^T A, E -= Q g,
W -= Q x; 6 p q r FLOPs per matrix), alone, as a floor for its ratio. Writes results/bench/optimizers.csv.

    .venv/bin/python benchmarks/bench_optimizers.py [--repeats 7 --threads 1]
"""

from __future__ import annotations

import time

import torch
from common import machine, median, timing_arguments, write_csv
from torch import nn

from lowcomm.model import Transformer, model_config
from lowcomm.optim import build_optimizer
from lowcomm.optim.lowrank_adam import LowRankAdam
from lowcomm.optim.projection import add_lifted, project, projection_side

SIZES = ("lordo-16m", "lordo-125m", "llama3-320m")
OPTIMIZERS = {name: {"name": name} for name in ("adamw", "galore", "ldadam", "lordo_local_step", "dion", "orth_dion",
                                                "ada_orth_dion", "muon")}
OPTIMIZERS["orth_dion_cholesky_qr"] = {"name": "orth_dion", "qr_method": "cholesky_qr"}
OPTIMIZERS["muon_float32"] = {"name": "muon", "ns_dtype": "float32"}
FLOOR = "lordo_projections"


class Matrices(nn.Module):
    """The hidden matrices of one layer of `size`, as parameters with fixed random gradients."""

    def __init__(self, size: str):
        super().__init__()
        with torch.device("meta"):
            shapes = [(n, p.shape) for n, p in Transformer(model_config(size, n_layers=1)).hidden_matrices()]
        generator = torch.Generator().manual_seed(0)
        self.weights = nn.ParameterList(nn.Parameter(0.02 * torch.randn(*s, generator=generator)) for _, s in shapes)
        self.names = [n for n, _ in shapes]
        for p in self.weights:
            p.grad = torch.randn(p.shape, generator=generator)

    def hidden_matrices(self) -> list[tuple[str, nn.Parameter]]:
        return list(zip(self.names, self.weights))


class ProjectionFloor:
    """The rank-r products of one LoRDO local step with the bases of `lordo`: per matrix, g = project(G, Q), then
    E -= lift(g) and W -= lift(g) in place on scratch copies, as the step does them (the elementwise work left out)."""

    def __init__(self, lordo: LowRankAdam):
        self.matrices = [(p.grad, lordo.state[p]["basis"], projection_side(p.shape), p.detach().clone(),
                          p.detach().clone()) for p in lordo.lowrank_params()]

    def step(self) -> None:
        for G, Q, side, error, weight in self.matrices:
            g = project(G, Q, side)
            add_lifted(error, g, Q, side, -1.0)
            add_lifted(weight, g, Q, side, -1e-3)


def main() -> None:
    args = timing_arguments(__doc__.splitlines()[0])
    rows = []
    for size in SIZES:
        matrices = Matrices(size)
        optimizers = {label: build_optimizer({**config, "lr": 1e-3}, matrices) for label, config in OPTIMIZERS.items()}
        # LoRDO's local step takes its basis from the sync engine (the first averaged gradient); here, the gradient
        optimizers["lordo_local_step"].set_bases_from([p.grad for p in optimizers["lordo_local_step"].lowrank_params()])
        optimizers["lordo_local_step"].measure_update_rms = False  # as training's steps between logged ones
        optimizers[FLOOR] = ProjectionFloor(optimizers["lordo_local_step"])
        times = {name: [] for name in optimizers}
        for repeat in range(args.warmup + args.repeats):
            for name, optimizer in optimizers.items():
                start = time.perf_counter()
                optimizer.step()
                if repeat >= args.warmup:
                    times[name].append(time.perf_counter() - start)
        adamw = median(times["adamw"])
        for name in optimizers:
            step = median(times[name])
            rows.append({"size": size, "matrices": len(matrices.names), "optimizer": name,
                         "step_ms": round(step * 1e3, 3), "ratio_to_adamw": round(step / adamw, 3)})
            print(f"{size:12s} {name:17s} {step * 1e3:9.2f} ms  {step / adamw:6.2f}x AdamW", flush=True)
    print(f"wrote {write_csv('optimizers', [{**r, **machine(args.threads)} for r in rows]).name}")


if __name__ == "__main__":
    main()
