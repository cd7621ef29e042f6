"""Optimizer-step time of Orth-Dion vs Dion vs torch.optim.Muon on the hidden matrices of llama3-320m (CPU).

Times `optimizer.step()` alone (gradients fixed) on the attention and MLP matrices of the first `--layers`
layers (every layer has the same five shapes, so the ratios hold for all 18), at rank fractions 1/8, 1/4, 1/2,
with Householder and with Cholesky-QR orthonormalization. All optimizers step the same parameter tensors
(only their state is their own), and they are interleaved within each repeat so that load from other
processes hits them alike. The best of the repeats is reported (the median is also in the JSON). One
thread by default: timings with more threads than free cores are dominated by OpenMP waits.
Prints a table and writes results/bench/dion.json.

    .venv/bin/python benchmarks/bench_dion.py [--layers 2] [--repeats 7] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from common import git_commit

from lowcomm.model import Transformer, model_config
from lowcomm.optim import Dion

MODEL = "llama3-320m"
RANK_FRACTIONS = (0.125, 0.25, 0.5)
QR_METHODS = ("householder", "cholesky_qr")
NORMALIZATIONS = {"dion": "column", "orth_dion": "qr"}


def hidden_matrix_shapes(layers: int) -> list[tuple[str, tuple[int, int]]]:
    """(name, shape) of the hidden matrices of the first `layers` layers, read from a meta-device model."""
    with torch.device("meta"):
        model = Transformer(model_config(MODEL, n_layers=layers))
    return [(name, tuple(p.shape)) for name, p in model.hidden_matrices()]


def make_matrices(shapes) -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(0)
    params = []
    for _, shape in shapes:
        p = torch.nn.Parameter(0.02 * torch.randn(*shape, generator=generator))
        p.grad = torch.randn(*shape, generator=generator)
        params.append(p)
    return params


def make_optimizers(params) -> dict[tuple[str, str, float], torch.optim.Optimizer]:
    """(method, qr_method, rank_fraction) -> optimizer; Muon is ("muon", "newton_schulz", 1.0)."""
    optimizers = {}
    for qr_method in QR_METHODS:
        for fraction in RANK_FRACTIONS:
            for method, normalization in NORMALIZATIONS.items():
                optimizers[method, qr_method, fraction] = Dion(
                    params, lr=0.01, rank_fraction=fraction, normalization=normalization, qr_method=qr_method)
    optimizers["muon", "newton_schulz", 1.0] = torch.optim.Muon(params, lr=0.02, weight_decay=0.01)
    return optimizers


def time_step(optimizer: torch.optim.Optimizer) -> float:
    start = time.perf_counter()
    optimizer.step()
    return time.perf_counter() - start


def table_rows(best_ms: dict, median_ms: dict) -> list[dict]:
    muon = best_ms["muon", "newton_schulz", 1.0]
    rows = []
    for qr_method in QR_METHODS:
        for fraction in RANK_FRACTIONS:
            dion, orth = best_ms["dion", qr_method, fraction], best_ms["orth_dion", qr_method, fraction]
            median_ratio = median_ms["orth_dion", qr_method, fraction] / median_ms["dion", qr_method, fraction]
            rows.append(dict(qr_method=qr_method, rank_fraction=fraction, dion_ms=dion, orth_dion_ms=orth,
                             muon_ms=muon, orth_dion_over_dion=orth / dion, orth_dion_over_muon=orth / muon,
                             dion_over_muon=dion / muon, orth_dion_over_dion_of_medians=median_ratio))
    return rows


def print_table(rows: list[dict]) -> None:
    print(f"{'qr_method':>12} {'rank':>6} {'dion ms':>8} {'orth ms':>8} {'muon ms':>8} {'orth/dion':>9} "
          f"{'orth/muon':>9} {'dion/muon':>9} {'orth/dion (medians)':>20}")
    for r in rows:
        print(f"{r['qr_method']:>12} {r['rank_fraction']:>6.3f} {r['dion_ms']:>8.1f} {r['orth_dion_ms']:>8.1f} "
              f"{r['muon_ms']:>8.1f} {r['orth_dion_over_dion']:>9.3f} {r['orth_dion_over_muon']:>9.3f} "
              f"{r['dion_over_muon']:>9.3f} {r['orth_dion_over_dion_of_medians']:>20.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1,
                        help="intra-op threads (default 1: with more threads than free cores, OpenMP "
                             "slows down by orders of magnitude on a shared machine)")
    parser.add_argument("--out", type=Path, default=Path("results/bench/dion.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    shapes = hidden_matrix_shapes(args.layers)
    optimizers = make_optimizers(make_matrices(shapes))
    for _ in range(args.warmup):
        for optimizer in optimizers.values():
            optimizer.step()
    samples: dict[tuple, list[float]] = {key: [] for key in optimizers}
    for _ in range(args.repeats):
        for key, optimizer in optimizers.items():
            samples[key].append(time_step(optimizer))
    best_ms = {key: 1e3 * min(times) for key, times in samples.items()}
    median_ms = {key: 1e3 * statistics.median(times) for key, times in samples.items()}
    rows = table_rows(best_ms, median_ms)

    print(f"{MODEL}: {len(shapes)} hidden matrices of {args.layers} layers, shapes {sorted({s for _, s in shapes})}; "
          f"torch {torch.__version__}, {args.threads} threads, best of {args.repeats} steps")
    print_table(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record = dict(model=MODEL, layers=args.layers, matrices=[dict(name=n, shape=list(s)) for n, s in shapes],
                  torch=torch.__version__, threads=args.threads, repeats=args.repeats, warmup=args.warmup,
                  commit=git_commit(), device="cpu", rows=rows,
                  samples_ms={"/".join(map(str, key)): [1e3 * t for t in times] for key, times in samples.items()})
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
