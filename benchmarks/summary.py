"""results/bench/summary.md from the benchmark CSVs: every figure beside its goal, with the command that measures it.

    .venv/bin/python benchmarks/summary.py
"""

from __future__ import annotations

import pandas as pd
from common import BENCH_DIR


def read(name: str) -> pd.DataFrame | None:
    path = BENCH_DIR / f"{name}.csv"
    return pd.read_csv(path) if path.exists() else None


def verdict(value: float, goal: float, below: bool = True) -> str:
    return "met" if (value <= goal if below else value >= goal) else "not met"


def paired_ratio(df: pd.DataFrame, ours: str, anchor: str) -> tuple[float, str]:
    """Median over repetitions of ours' wall time / the anchor's in the same repetition (they ran in turns), and the
    range of those ratios, e.g. '1.21x (1.18-1.25x over 3)'."""
    walls = df.pivot_table(index="repeat", columns="case", values="wall_s")
    ratios = walls[ours] / walls[anchor]
    return ratios.median(), f"{ratios.median():.2f}x ({ratios.min():.2f}-{ratios.max():.2f}x over {len(ratios)})"


def harness_rows(df: pd.DataFrame) -> list[tuple]:
    med = df.groupby("case")[["wall_s", "tokens_per_s"]].median()
    rows = []
    for ours, anchor, goal in (("lowcomm_1_worker", "plain_loop", 1.05), ("lowcomm_4_workers", "plain_ddp_4_workers", 1.03)):
        ratio, shown = paired_ratio(df, ours, anchor)
        tps = med.loc[ours, "tokens_per_s"] / med.loc[anchor, "tokens_per_s"]
        rows.append((f"wall time, `lowcomm.training.train` {ours.split('_', 1)[1].replace('_', ' ')} / {anchor.replace('_', ' ')} "
                     f"({int(df.steps.max())} steps; training tokens/s ratio {tps:.2f})",
                     f"<= {goal:.2f}x", shown, verdict(ratio, goal), "bench_harness.py"))
    return rows


def startup_rows(df: pd.DataFrame) -> list[tuple]:
    med = df.groupby("case")[["wall_s", "first_step_s"]].median()
    rows = []
    for case in ("startup_4_workers", "startup_1_worker"):
        first, wall = med.loc[case, "first_step_s"], med.loc[case, "wall_s"]
        goal = "< 8 s" if case == "startup_4_workers" else "-"
        rows.append((f"command to end of first step, {case.split('_', 1)[1].replace('_', ' ')} (whole 1-step run {wall:.1f} s)",
                     goal, f"{first:.1f} s", verdict(first, 8.0) if goal != "-" else "-", "bench_harness.py"))
    if "startup_plain_loop" in med.index:
        ratio, shown = paired_ratio(df, "startup_1_worker", "startup_plain_loop")
        rows.append((f"whole 1-step run, 1 worker / plain loop 1 step ({med.loc['startup_1_worker', 'wall_s']:.1f} s / "
                     f"{med.loc['startup_plain_loop', 'wall_s']:.1f} s)", "<= 1.30x", shown, verdict(ratio, 1.30),
                     "bench_harness.py"))
    return rows


def flops_rows(df: pd.DataFrame) -> list[tuple]:
    rows = []
    for _, r in df.iterrows():
        kind = "torch.compile" if r.compiled else "eager"
        rows.append((f"training step FLOP/s / matmul peak, {r['size']} model, one process, {kind} "
                     f"({r.achieved_gflops:.1f} of {r.peak_gflops:.1f} GFLOP/s)", ">= 35 %",
                     f"{r.share_of_peak:.1%}", verdict(r.share_of_peak, 0.35, below=False), "bench_flops.py"))
    return rows


def sync_rows(df: pd.DataFrame) -> list[tuple]:
    rows = []
    for _, r in df.iterrows():
        goal = "< 3 %" if r.K == 32 else "-"
        rows.append((f"LoRDO sync amortized per step, {r['size']}, {r.basis_method}, K = {r.K} "
                     f"(sync {r.sync_s * 1e3:.0f} ms, step {r.training_step_s * 1e3:.0f} ms)", goal,
                     f"{r.amortized_share:.2%}", verdict(r.amortized_share, 0.03) if r.K == 32 else "-",
                     "bench_lordo_sync.py"))
    return rows


def optimizer_rows(df: pd.DataFrame) -> list[tuple]:
    rows = []
    for size, part in df.groupby("size", sort=False):
        by = part.set_index("optimizer")
        lordo = by.loc["lordo_local_step", "ratio_to_adamw"]
        orth = by.loc["orth_dion", "step_ms"] / by.loc["dion", "step_ms"]
        floor = (f" (its three rank-r products alone: {by.loc['lordo_projections', 'ratio_to_adamw']:.2f}x)"
                 if "lordo_projections" in by.index else "")
        rows.append((f"LoRDO local step / foreach AdamW, {size} matrices{floor}", "<= 1.35x", f"{lordo:.2f}x",
                     verdict(lordo, 1.35), "bench_optimizers.py"))
        cholesky = (f" (with qr_method=cholesky_qr: {by.loc['orth_dion_cholesky_qr', 'step_ms'] / by.loc['dion', 'step_ms']:.2f}x)"
                    if "orth_dion_cholesky_qr" in by.index else "")
        rows.append((f"orth_dion / dion optimizer step, {size} matrices{cholesky}", "<= 1.10x", f"{orth:.2f}x",
                     verdict(orth, 1.10), "bench_optimizers.py"))
        others = ", ".join(f"{name} {ratio:.2f}x" for name, ratio in by["ratio_to_adamw"].items()
                           if name not in ("adamw", "lordo_projections"))
        rows.append((f"every optimizer / AdamW, {size}: {others}", "-", "-", "-", "bench_optimizers.py"))
    return rows


def newton_schulz_rows(df: pd.DataFrame) -> list[tuple]:
    rows = []
    for size, part in df.groupby("size", sort=False):
        by = part.set_index("way")
        native = "native" if by["native_bfloat16"].iloc[0] else "no native"
        ratio = by.loc["bfloat16_fp32_accumulate", "ratio_to_bfloat16_torch"]
        rows.append((f"NS_5 of one {size} layer's matrices in bfloat16, products accumulated in float32 / torch's "
                     f"kernels ({by.loc['bfloat16_torch', 'ns5_ms']:.1f} ms; CPU with {native} bfloat16; float32 "
                     f"{by.loc['float32', 'ratio_to_bfloat16_torch']:.3f}x)", "-", f"{ratio:.3f}x", "-",
                     "bench_newton_schulz.py"))
    return rows


def main() -> None:
    sections = {"harness": harness_rows, "startup": startup_rows, "flops": flops_rows, "lordo_sync": sync_rows,
                "optimizers": optimizer_rows, "newton_schulz": newton_schulz_rows}
    lines = ["# Benchmark summary", "",
             "Generated by `benchmarks/summary.py` from the CSVs beside it (`make bench`); each CSV records the machine, "
             "torch version, threads and commit of its run. Ratios are of medians over repetitions taken in turns.", ""]
    machines = set()
    lines += ["| figure | goal | measured | verdict | script |", "|:--|:--|:--|:--|:--|"]
    for name, rows_of in sections.items():
        df = read(name)
        if df is None:
            lines.append(f"| {name}: not measured yet | | | | |")
            continue
        machines |= {f"{m}, torch {t}, commit {c[:7]}" for m, t, c in zip(df.machine, df.torch, df.commit)}
        lines += [f"| {' | '.join(map(str, row))} |" for row in rows_of(df)]
    lines += ["", "Measured on: " + "; ".join(sorted(machines)) + ".", ""]
    (BENCH_DIR / "summary.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
