"""Run records: one directory per run with the resolved config, per-step metrics and a final JSON record."""

from __future__ import annotations

import csv
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf


def git_commit() -> str:
    """The repository's HEAD commit (with '-dirty' when tracked files differ), or 'unknown'."""
    root = Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "src", "experiments"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def environment(accelerator: str) -> dict:
    device = torch.cuda.get_device_name(0) if accelerator == "gpu" and torch.cuda.is_available() else platform.processor() or platform.machine()
    return {
        "git_commit": git_commit(),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "device": device,
        "cpu_count": os.cpu_count(),
    }


class RunDirectory:
    """`<out_dir>/<name>/`: config.yaml, metrics.csv (one row per logged step), record.json (written last)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.metrics_path = self.path / "metrics.csv"
        self._columns: list[str] | None = None
        self._rows: list[dict] = []
        self.started = time.time()

    def create(self, cfg: DictConfig) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(cfg, self.path / "config.yaml")

    def log(self, row: dict) -> None:
        """Append a metrics row; the CSV is rewritten when a new column appears."""
        self._rows.append(row)
        columns = list(dict.fromkeys([*(self._columns or []), *row]))
        if columns != self._columns:
            self._columns = columns
            with open(self.metrics_path, "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=columns)
                writer.writeheader()
                writer.writerows(self._rows)
        else:
            with open(self.metrics_path, "a", newline="") as f:
                csv.DictWriter(f, fieldnames=columns).writerow(row)

    def write_record(self, record: dict) -> None:
        record = {**record, "wall_time_s": time.time() - self.started}
        with open(self.path / "record.json", "w") as f:
            json.dump(record, f, indent=2, sort_keys=True)


def read_record(path: str | Path) -> dict:
    with open(Path(path) / "record.json") as f:
        return json.load(f)
