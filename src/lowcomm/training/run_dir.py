"""Run records: one directory per run with the resolved config, per-step metrics and a final JSON record.

A record's `status` says how the run ended: complete, interrupted (SIGINT / SIGTERM), diverged (a non-finite
loss) or failed (a worker died or stopped responding).
"""

from __future__ import annotations

import csv
import errno
import io
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Callable

import torch
from omegaconf import OmegaConf

import lowcomm
from lowcomm.config import ConfigError, RunConfig
from lowcomm.optim.muon import native_bfloat16
from lowcomm.paths import ROOT
from lowcomm.stored import RERUN, StoredFileError, read_json

STATUSES = ("complete", "interrupted", "diverged", "failed")
NOT_A_CHECKOUT = "not-a-checkout"  # a record's git_commit when the package was not imported from a git checkout
SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)  # a write that failed for lack of disk space (or quota)


class NoSpace(Exception):
    """A write that failed for lack of disk space, with what it needed; its temporary file is already removed."""

    def __init__(self, path: Path, needed: int):
        super().__init__(f"no space left on device writing {path} ({needed:,} bytes needed)")
        self.path, self.needed = Path(path), needed


def write_atomically(path: Path, needed: int, write: Callable[[Path], None]) -> None:
    """write(tmp), then rename tmp to `path`, so a file of that name is always whole; a write that fails for lack of
    space removes tmp and raises NoSpace(path, needed)."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        if err.errno in SPACE_ERRNOS:
            raise NoSpace(path, needed) from None
        raise


def tensor_bytes(tree) -> int:
    """Bytes of every tensor in a nested dict / list (what a checkpoint or state dict needs on disk, roughly)."""
    if isinstance(tree, torch.Tensor):
        return tree.numel() * tree.element_size()
    if isinstance(tree, dict):
        return sum(tensor_bytes(v) for v in tree.values())
    if isinstance(tree, (list, tuple)):
        return sum(tensor_bytes(v) for v in tree)
    return 0


def git_changes(root: Path = ROOT) -> list[str]:
    """The paths under src/ and experiments/ whose working copy differs from HEAD (`git status --porcelain`)."""
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "--", "src", "experiments"],
                            cwd=root, capture_output=True, text=True, check=True).stdout
    return sorted(line[3:] for line in status.splitlines())


def git_commit(root: Path = ROOT) -> str:
    """The repository's HEAD commit (with '-dirty' when git_changes is not empty), or 'unknown'."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
        return sha + ("-dirty" if git_changes(root) else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def checkout() -> Path | None:
    """The git checkout the package is imported from: ROOT when ROOT (two folders above the package) is the top of a
    git work tree, as in `pip install -e .`; None for an installed package (site-packages is no checkout's top)."""
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return ROOT if Path(top).resolve() == ROOT else None


def package_version() -> str | None:
    """The installed lowcomm distribution's version; None when the package is imported without being installed."""
    try:
        return version("lowcomm")
    except PackageNotFoundError:
        return None


def code_source() -> dict:
    """What code a run runs: the package's version and folder (relative to its checkout, so a stored record names no
    machine's path; absolute for an installed package), and the commit of its checkout (with '-dirty' and the
    changed files under src/ and experiments/), or git_commit NOT_A_CHECKOUT for an installed package."""
    root = checkout()
    commit = git_commit(root) if root else NOT_A_CHECKOUT
    package = Path(lowcomm.__file__).resolve().parent
    return {
        "lowcomm_version": package_version(),
        "lowcomm_location": str(package.relative_to(root) if root else package),
        "git_commit": commit,
        "git_changes": git_changes(root) if commit.endswith("-dirty") else [],
    }


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name: cpuinfo's first `model name` line where the file has one (Linux), else what `platform`
    says of the processor (its architecture where it says nothing)."""
    try:
        lines = cpuinfo.read_text().splitlines()
    except OSError:
        lines = []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name") and ":" in line]
    return names[0] if names and names[0] else platform.processor() or platform.machine()


def environment(accelerator: str) -> dict:
    """The run record's provenance: the code (code_source), library versions, the machine and its device (the GPU's
    name, else the CPU's model), and whether the CPU multiplies bfloat16 natively (what Muon's ns_matmul=auto reads)."""
    device = torch.cuda.get_device_name(0) if accelerator == "gpu" and torch.cuda.is_available() else cpu_model()
    return {
        **code_source(),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "device": device,
        "cpu_count": os.cpu_count(),
        "cpu_native_bfloat16": native_bfloat16(),
    }


def finite_or_null(value):
    """`value` with every non-finite float (NaN, inf) replaced by None, so that it is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_or_null(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_null(v) for v in value]
    return value


class RunDirectory:
    """`<out_dir>/<name>/`: config.yaml, metrics.csv (one row per logged step), checkpoints/, model.pt and
    record.json (written last)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.metrics_path = self.path / "metrics.csv"
        self._columns: list[str] | None = None
        self._rows: list[dict] = []
        self.started = time.time()

    def check_free(self, overwrite: bool = False) -> None:
        """ConfigError when the directory already holds files (another run) and `overwrite` is not set."""
        held = sorted(p.name for p in self.path.iterdir()) if self.path.is_dir() else []
        if held and not overwrite:
            record = self.path / "record.json"
            what = (f"a run (record.json status {read_record(self.path).get('status', 'unknown')})"
                    if record.exists() else f"files ({', '.join(held[:4])})")
            raise ConfigError(f"run directory {self.path} already holds {what}: choose another run.name, "
                              "or set run.overwrite=true to clear it first")

    def create(self, cfg: RunConfig, overwrite: bool = False) -> None:
        """Make the directory and write config.yaml (the loaded config, `cfg.tree`). A directory that already holds
        files (another run) is an error, unless `overwrite`, which clears it first. config.yaml is created
        exclusively (O_EXCL), so of two runs started into one directory at once exactly one gets it."""
        try:
            self.check_free(overwrite)
            if overwrite and self.path.is_dir():
                shutil.rmtree(self.path)
            self.path.mkdir(parents=True, exist_ok=True)
            try:
                with open(self.path / "config.yaml", "x") as f:
                    f.write(OmegaConf.to_yaml(cfg.tree))
            except FileExistsError:
                raise ConfigError(f"run directory {self.path} was taken by another run just now: choose another "
                                  "run.name") from None
        except OSError as err:
            raise ConfigError(f"run.out_dir={cfg.run.out_dir}: cannot write the run directory {self.path} "
                              f"({err.strerror or err}): choose a writable run.out_dir") from None

    def log(self, row: dict) -> None:
        """Append a metrics row; the CSV is rewritten (whole, renamed into place) when a new column appears. A row
        that does not fit on the disk is taken back (NoSpace), so the file stays a complete CSV."""
        self._rows.append(row)
        columns = list(dict.fromkeys([*(self._columns or []), *row]))
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=columns)
        if columns != self._columns:
            writer.writeheader()
            writer.writerows(self._rows)
            write_atomically(self.metrics_path, len(text.getvalue()), lambda tmp: tmp.write_text(text.getvalue()))
            self._columns = columns
            return
        writer.writerow(row)
        with open(self.metrics_path, "a", newline="") as f:
            end = f.tell()
            try:
                f.write(text.getvalue())
                f.flush()
            except OSError as err:
                f.truncate(end)
                if err.errno in SPACE_ERRNOS:
                    raise NoSpace(self.metrics_path, len(text.getvalue())) from None
                raise

    def write_record(self, record: dict) -> None:
        """record.json, the run's last file: strict JSON (non-finite numbers as null), written to a temporary
        file and renamed into place, so that a reader sees the whole record or none."""
        if record.get("status") not in STATUSES:
            raise ValueError(f"record status {record.get('status')!r}: use one of {STATUSES}")
        text = json.dumps(finite_or_null({**record, "wall_time_s": time.time() - self.started}), indent=2,
                          sort_keys=True, allow_nan=False)

        def write(tmp: Path) -> None:
            with open(tmp, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
        write_atomically(self.path / "record.json", len(text), write)

    def write_model(self, model: torch.nn.Module) -> None:
        """model.pt: the weights and the ModelConfig (lowcomm.eval.evaluate.load_run), whole or not at all."""
        state = {"model": model.state_dict(), "model_config": model.cfg}
        write_atomically(self.path / "model.pt", tensor_bytes(state), lambda tmp: torch.save(state, tmp))


def read_record(path: str | Path) -> dict:
    """The record.json of the run directory `path`; a StoredFileError when it is missing or not JSON."""
    return read_json(Path(path) / "record.json", RERUN)


def completed_record(run_dir: str | Path) -> dict | None:
    """The run's record when it says `status: complete`, else None (no record, one that cannot be read, or one of an
    unfinished run)."""
    try:
        record = read_record(run_dir)
    except StoredFileError:
        return None
    return record if record.get("status") == "complete" else None


def checkpoint_path(run_dir: str | Path, step: int) -> Path:
    """Step t's checkpoint, the path run.resume_from takes: `<run_dir>/checkpoints/step<t as 6 digits>.ckpt`."""
    return Path(run_dir) / "checkpoints" / f"step{step:06d}.ckpt"


def rank_checkpoint_file(checkpoint: str | Path, rank: int) -> Path:
    """Rank r's file of the checkpoint `.../stepNNNNNN.ckpt`: `.../stepNNNNNN.rank<r>.ckpt`."""
    return Path(checkpoint).with_suffix(f".rank{rank}.ckpt")


def last_checkpoint(run_dir: str | Path, world_size: int) -> Path | None:
    """The latest `checkpoint_path` for which every rank's `rank_checkpoint_file` exists; None when there is none."""
    files = (Path(run_dir) / "checkpoints").glob("step[0-9]*.rank[0-9]*.ckpt")
    for step in sorted({int(p.name.split(".")[0][len("step"):]) for p in files}, reverse=True):
        checkpoint = checkpoint_path(run_dir, step)
        if all(rank_checkpoint_file(checkpoint, r).exists() for r in range(world_size)):
            return checkpoint
    return None
