"""Harness overhead and start-up: whole processes of `lowcomm.training.train` beside plain PyTorch anchors, side by side.

- overhead: `lowcomm.training.train` (method ddp) against benchmarks/plain_loop.py with one worker and against
  benchmarks/plain_ddp.py (DistributedDataParallel over gloo) with four, same model, data, optimizer, schedule,
  steps and threads; whole-process wall time and training tokens/s.
- start-up: `lowcomm.training.train` from the command to the end of its first training step (the first metrics row past
  step 0, watched from outside), with one and with four workers; the whole 1-step run with one worker against the
  plain loop's 1-step run.
Commands take turns, repetition by repetition; medians. Writes results/bench/harness.csv (overhead) and
results/bench/startup.csv.

    .venv/bin/python benchmarks/bench_harness.py [--steps 200 --repeats 3] [--only overhead|startup]
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, machine, median, write_csv

PY = sys.executable


def lowcomm_command(out: Path, name: str, steps: int, devices: int, threads: int) -> list[str]:
    return [PY, "-m", "lowcomm.training.train", "experiments/train/config.yaml", "method=ddp", f"train.devices={devices}",
            f"train.threads={threads}", f"train.steps={steps}", f"train.warmup={max(1, steps // 8)}",
            f"train.val_every={steps}", "data.val_batches=1", "train.progress_bar=false",
            f"run.out_dir={out}", f"run.name={name}", "run.overwrite=true"]


def first_step_row(metrics: Path) -> bool:
    if not metrics.exists():
        return False
    with open(metrics) as f:
        return any(row["step"] not in ("", "0") for row in csv.DictReader(f))


def run(command: list[str], metrics: Path | None = None) -> dict:
    """Whole-process wall time; for a lowcomm run, also the time until its first step's metrics row appears."""
    if metrics is not None:
        shutil.rmtree(metrics.parent, ignore_errors=True)  # a previous repetition's metrics are not this run's
    start = time.perf_counter()
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = None
    while proc.poll() is None:
        if metrics is not None and first is None and first_step_row(metrics):
            first = time.perf_counter() - start
        time.sleep(0.01)
    wall = time.perf_counter() - start
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{err[-2000:]}")
    return {"wall_s": wall, "first_step_s": first, "stdout": out}


def lowcomm_tokens_per_s(run_dir: Path) -> float:
    return json.loads((run_dir / "record.json").read_text())["tokens_per_s"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2, help="torch threads of the one-worker runs")
    p.add_argument("--only", choices=("overhead", "startup"), help="one of the two benchmarks")
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        cases = {
            "plain_loop": lambda: [PY, "benchmarks/plain_loop.py", f"--steps={args.steps}",
                                   f"--threads={args.threads}"],
            "lowcomm_1_worker": lambda: lowcomm_command(out, "one", args.steps, 1, args.threads),
            "plain_ddp_4_workers": lambda: [PY, "benchmarks/plain_ddp.py", f"--steps={args.steps}", "--workers=4"],
            "lowcomm_4_workers": lambda: lowcomm_command(out, "four", args.steps, 4, 1),
            "startup_plain_loop": lambda: [PY, "benchmarks/plain_loop.py", "--steps=1", f"--threads={args.threads}"],
            "startup_1_worker": lambda: lowcomm_command(out, "start1", 1, 1, args.threads),
            "startup_4_workers": lambda: lowcomm_command(out, "start4", 1, 4, 1),
        }
        run_dirs = {"lowcomm_1_worker": "one", "lowcomm_4_workers": "four", "startup_1_worker": "start1",
                    "startup_4_workers": "start4"}
        if args.only:
            cases = {case: command for case, command in cases.items() if case.startswith("startup") == (
                args.only == "startup")}
        for repeat in range(args.repeats):
            for case, command in cases.items():
                run_dir = out / run_dirs[case] if case in run_dirs else None
                result = run(command(), run_dir / "metrics.csv" if run_dir else None)
                tps = (lowcomm_tokens_per_s(run_dir) if run_dir else json.loads(result["stdout"].splitlines()[-1])
                       ["tokens_per_s"])
                rows.append({"case": case, "repeat": repeat, "steps": 1 if case.startswith("startup") else args.steps,
                             "wall_s": round(result["wall_s"], 3), "tokens_per_s": round(tps, 1),
                             "first_step_s": None if result["first_step_s"] is None
                             else round(result["first_step_s"], 3)})
                print(f"{case:20s} repeat {repeat}: {result['wall_s']:.2f} s, {tps:,.0f} tok/s", flush=True)
    info = machine(args.threads)
    for name in ("overhead", "startup"):
        part = [{**row, **info} for row in rows if row["case"].startswith("startup") == (name == "startup")]
        if part:
            print(f"wrote {write_csv('harness' if name == 'overhead' else 'startup', part).relative_to(ROOT)}")
    for case in cases:
        walls = [r["wall_s"] for r in rows if r["case"] == case]
        print(f"{case:20s} median wall {median(walls):.2f} s")


if __name__ == "__main__":
    main()
