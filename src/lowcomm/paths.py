"""Where things lie: the package's own data (the method presets, read through importlib.resources, so an installed
package has them) and the checkout's experiment files, which only the reproduction layer reads."""

from importlib.resources import files
from pathlib import Path

METHODS_DIR = files("lowcomm") / "methods"

ROOT = Path(__file__).resolve().parents[2]  # the checkout, when the package is its src/lowcomm
EXPERIMENTS = ROOT / "experiments"
SHARED_PRESETS = EXPERIMENTS / "presets.yaml"
TUNED_FILE = EXPERIMENTS / "tuned_lr.yaml"
FIGURES_DIR = ROOT / "paper_figures"


def method_names() -> list[str]:
    """The method presets that ship with the package: the names of METHODS_DIR/<name>.yaml, sorted."""
    return sorted(p.name.removesuffix(".yaml") for p in METHODS_DIR.iterdir() if p.name.endswith(".yaml"))
