"""Time of Muon's NS_5 on the hidden matrices of one layer of the cpu model and of lordo-16m, per way of computing it:
bfloat16 with torch's kernels (torch.optim.Muon's), bfloat16 with products accumulated in float32 and rounded once
(`ns_matmul=fp32_accumulate`), and float32. Where the CPU has no native bfloat16, torch's bfloat16 matmul is a scalar
fallback, which `ns_matmul=auto` avoids. The ways take turns within each repeat (medians after warm-up); one thread
by default. Writes results/bench/newton_schulz.csv.

    .venv/bin/python benchmarks/bench_newton_schulz.py [--repeats 7 --threads 1]
"""

from __future__ import annotations

import time

import torch
from common import machine, median, timing_arguments, write_csv

from lowcomm.model import Transformer, model_config
from lowcomm.optim.muon import NS_COEFFICIENTS, NS_EPS, native_bfloat16, newton_schulz

SIZES = ("cpu", "lordo-16m")
WAYS = {"bfloat16_torch": (torch.bfloat16, "torch"), "bfloat16_fp32_accumulate": (torch.bfloat16, "fp32_accumulate"),
        "float32": (torch.float32, "torch")}
REFERENCE = "bfloat16_torch"


def layer_matrices(size: str) -> list[torch.Tensor]:
    """Random matrices of the shapes of one layer's hidden matrices of `size`."""
    with torch.device("meta"):
        shapes = [p.shape for _, p in Transformer(model_config(size, n_layers=1)).hidden_matrices()]
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(*shape, generator=generator) for shape in shapes]


def main() -> None:
    args = timing_arguments(__doc__.splitlines()[0])
    rows = []
    for size in SIZES:
        matrices = layer_matrices(size)
        times = {way: [] for way in WAYS}
        for repeat in range(args.warmup + args.repeats):
            for way, (dtype, matmul) in WAYS.items():
                start = time.perf_counter()
                for matrix in matrices:
                    newton_schulz(matrix, 5, NS_COEFFICIENTS, NS_EPS, dtype, matmul)
                if repeat >= args.warmup:
                    times[way].append(time.perf_counter() - start)
        reference = median(times[REFERENCE])
        for way in WAYS:
            ms = median(times[way])
            rows.append({"size": size, "matrices": len(matrices), "way": way, "ns5_ms": round(ms * 1e3, 3),
                         "ratio_to_bfloat16_torch": round(ms / reference, 3), "native_bfloat16": native_bfloat16()})
            print(f"{size:10s} {way:26s} {ms * 1e3:9.2f} ms  {ms / reference:6.3f}x torch's bfloat16", flush=True)
    print(f"wrote {write_csv('newton_schulz', [{**r, **machine(args.threads)} for r in rows]).name}")


if __name__ == "__main__":
    main()
