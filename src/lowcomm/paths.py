"""Where the repository keeps what the package reads: experiment configs, method presets, task files."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = ROOT / "experiments"
METHODS_DIR = EXPERIMENTS / "methods"
SHARED_PRESETS = EXPERIMENTS / "presets.yaml"
TUNED_FILE = EXPERIMENTS / "tuned_lr.yaml"
TASKS_DIR = ROOT / "tasks"
FIGURES_DIR = ROOT / "paper_figures"
