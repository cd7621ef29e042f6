import importlib.util
from pathlib import Path

import pandas as pd

SCRIPT = Path(__file__).resolve().parents[1] / "paper_figures" / "make_figures.py"


def load_script():
    spec = importlib.util.spec_from_file_location("make_figures", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_figures_are_drawn_from_stored_runs(tmp_path):
    for label, seed, losses in (("ddp", 0, [8.0, 5.0, 4.0]), ("ddp", 1, [8.0, 5.2, 4.1]), ("lordo", 0, [8.0, 5.5, 4.4])):
        run = tmp_path / "results" / "demo" / "cpu" / "runs" / f"{label}-s{seed}"
        run.mkdir(parents=True)
        pd.DataFrame({"step": [0, 10, 20], "val_loss": losses, "loss": [None, 5.1, 4.2]}).to_csv(run / "metrics.csv")
    figures = load_script()
    curves = figures.validation_curves(tmp_path / "results" / "demo" / "cpu" / "runs")
    assert sorted(curves["label"].unique()) == ["ddp", "lordo"] and len(curves) == 9
    written = figures.main(tmp_path / "results", tmp_path)
    assert written == [tmp_path / "demo_cpu.png"]
    assert (tmp_path / "demo_cpu.png").stat().st_size > 1000 and (tmp_path / "demo_cpu.pdf").exists()
