"""What every benchmark records beside its figures: the machine, torch, threads and commit (no paths), and where."""

from __future__ import annotations

import argparse
import csv
import os
import platform
import statistics
import subprocess
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
BENCH_DIR = ROOT / "results" / "bench"


def git_commit() -> str:
    result = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return result.stdout.strip() if result.returncode == 0 else "unknown"


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def timing_arguments(description: str) -> argparse.Namespace:
    """A step benchmark's options, parsed: --repeats (medians over them), --warmup, --threads (torch is set to it)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    return args


def machine(threads: int) -> dict:
    return {"machine": f"{cpu_model()}, {os.cpu_count()} cores", "torch": torch.__version__, "threads": threads,
            "commit": git_commit()}


def write_csv(name: str, rows: list[dict]) -> Path:
    """results/bench/<name>.csv, the union of the rows' keys as columns."""
    BENCH_DIR.mkdir(parents=True, exist_ok=True)
    path = BENCH_DIR / f"{name}.csv"
    columns = list(dict.fromkeys(k for row in rows for k in row))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        writer.writerows(rows)
    return path


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")
