"""`make figures` draws every stored experiment from results/ alone (no training); the smoke test draws each kind."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "paper_figures" / "make_figures.py"


def load_script():
    spec = importlib.util.spec_from_file_location("make_figures", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_figures_are_regenerated_from_committed_results(tmp_path):
    stored = {f"{p.parent.parent.name}_{p.parent.name}" for p in (ROOT / "results").glob("*/*/table.csv")}
    written = load_script().main(ROOT / "results", tmp_path)
    assert {p.stem for p in written} == stored
    assert all(p.stat().st_size > 10_000 and p.with_suffix(".pdf").exists() for p in written)
    committed = {p.stem for p in (ROOT / "paper_figures").glob("*.png")}
    assert committed == stored, "paper_figures/ must hold exactly the figures of the stored results: run `make figures`"
