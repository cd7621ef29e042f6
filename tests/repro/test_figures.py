"""`make figures` draws every stored experiment from results/ alone (no training); the smoke test draws each kind."""

from pathlib import Path

from lowcomm.repro import figures

ROOT = Path(__file__).resolve().parents[2]


def test_committed_figures_are_regenerated_from_committed_results(tmp_path):
    stored = {f"{p.parent.parent.name}_{p.parent.name}" for p in (ROOT / "results").glob("*/*/table.csv")}
    written = figures.main(ROOT / "results", tmp_path)
    assert {p.stem for p in written} == stored
    assert all(p.stat().st_size > 10_000 and p.with_suffix(".pdf").exists() for p in written)
    committed = {p.stem for p in (ROOT / "paper_figures").glob("*.png")}
    assert committed == stored, "paper_figures/ must hold exactly the figures of the stored results: run `make figures`"
