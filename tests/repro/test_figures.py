"""`make figures` draws every stored experiment from results/ alone (no training); the smoke test draws each kind."""

from pathlib import Path

from lowcomm.repro import figures
from lowcomm.repro.spec import experiments
from lowcomm.repro.store import ResultsStore

ROOT = Path(__file__).resolve().parents[2]


def test_committed_figures_are_regenerated_from_committed_results(tmp_path):
    stored = {f"{p.parent.parent.name}_{p.parent.name}" for p in (ROOT / "results").glob("*/*/table.csv")}
    written = figures.draw_all(ResultsStore(ROOT / "results", tmp_path))
    assert {p.stem for p in written} == stored
    assert all(p.stat().st_size > 10_000 and p.with_suffix(".pdf").exists() for p in written)
    committed = {p.stem for p in (ROOT / "paper_figures").glob("*.png")}
    assert committed == stored, "paper_figures/ must hold exactly the figures of the stored results: run `make figures`"


def test_every_preset_names_a_figure_kind_that_exists():
    for spec in experiments():
        for preset in spec.presets:
            kind = spec.figure_of(preset)
            assert kind is None or kind in figures.FIGURE_KINDS, f"{spec.name} {preset}: figure {kind!r}"


def test_the_forms_figure_places_each_run_at_the_beta_of_its_published_form():
    points = figures.published_form_points(ResultsStore(ROOT / "results").preset("beta_sweep", "forms"))
    betas = points.groupby("line")["beta"].apply(lambda b: sorted(set(b)))
    assert betas["dion summary form"] == [0.1, 0.3, 0.5, 0.7, 1.0]
    assert betas["orth_dion code form"] == [0.05, 0.1, 0.3, 0.5, 0.7, 1.0]  # 0.05: the default mu = 0.95
    assert points.groupby("line").size().to_dict() == {"dion code form": 18, "dion summary form": 15,
                                                       "orth_dion code form": 18, "orth_dion summary form": 15}
    shared = points[points["beta"] == 1.0].groupby("seed")["final_val_loss"].nunique()
    assert (shared == 2).all()  # per seed, one dion and one orth_dion run at beta = 1, on both lines
