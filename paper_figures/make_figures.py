"""Draw every experiment's validation curves from results/: paper_figures/<experiment>_<preset>.png and .pdf.

Reads results/<experiment>/<preset>/runs/<label>-s<seed>/metrics.csv; one line per label (mean over seeds,
shaded min-max). No number is typed in here: the figures are the stored runs.

    python paper_figures/make_figures.py [results_dir] [out_dir]
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402


def validation_curves(runs_dir: Path) -> pd.DataFrame:
    """Rows (label, seed, step, val_loss) of every run under `runs_dir`."""
    frames = []
    for metrics in sorted(runs_dir.glob("*/metrics.csv")):
        label, seed = metrics.parent.name.rsplit("-s", 1)
        df = pd.read_csv(metrics)
        df = df[df["val_loss"].notna()][["step", "val_loss"]]
        frames.append(df.assign(label=label, seed=int(seed)))
    return pd.concat(frames) if frames else pd.DataFrame(columns=["label", "seed", "step", "val_loss"])


def draw(curves: pd.DataFrame, title: str, out: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, runs in curves.groupby("label", sort=False):
        stats = runs.groupby("step")["val_loss"].agg(["mean", "min", "max"])
        ax.plot(stats.index, stats["mean"], label=label)
        ax.fill_between(stats.index, stats["min"], stats["max"], alpha=0.2)
    ax.set(xlabel="step", ylabel="validation loss (nats)", title=title)
    ax.set_ylim(top=curves[curves["step"] > 0]["val_loss"].max() * 1.05)
    ax.legend(fontsize=8)
    fig.tight_layout()
    for suffix in (".png", ".pdf"):
        fig.savefig(out.with_suffix(suffix), dpi=150)
    plt.close(fig)


def main(results: Path = Path("results"), out_dir: Path = Path("paper_figures")) -> list[Path]:
    written = []
    for runs_dir in sorted(results.glob("*/*/runs")):
        preset_dir = runs_dir.parent
        curves = validation_curves(runs_dir)
        if curves.empty:
            continue
        out = out_dir / f"{preset_dir.parent.name}_{preset_dir.name}"
        draw(curves, f"{preset_dir.parent.name} ({preset_dir.name} preset)", out)
        written.append(out.with_suffix(".png"))
    return written


if __name__ == "__main__":
    args = [Path(a) for a in sys.argv[1:]]
    for path in main(*args):
        print(f"wrote {path}")
