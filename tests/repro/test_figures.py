"""`make figures` draws every stored experiment from results/ alone (no training); the smoke test draws each kind."""

import shutil
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from lowcomm.config import ConfigError
from lowcomm.repro import figures
from lowcomm.repro.spec import TableSpec, experiments
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


def test_a_figure_kind_that_does_not_exist_is_named_before_any_figure_is_drawn(tmp_path, monkeypatch):
    for preset in ("lordo_balance/confirm", "table3_main/quick"):
        (tmp_path / "results" / preset).mkdir(parents=True)
        shutil.copy(ROOT / "results" / preset / "table.csv", tmp_path / "results" / preset / "table.csv")
    # table3_main draws after lordo_balance: without the check up front, lordo_balance's figure would be written
    monkeypatch.setattr(figures, "FIGURE_KINDS", {k: v for k, v in figures.FIGURE_KINDS.items() if k != "methods"})
    with pytest.raises(ConfigError, match=r"figure kinds that do not exist \(table3_main quick: 'methods'\)"):
        figures.draw_all(ResultsStore(tmp_path / "results", tmp_path / "figures"))
    assert not (tmp_path / "figures").exists()


def test_the_forms_figure_places_each_run_at_the_beta_of_its_published_form():
    points = figures.published_form_points(ResultsStore(ROOT / "results").preset("beta_sweep", "forms"))
    betas = points.groupby("line")["beta"].apply(lambda b: sorted(set(b)))
    assert betas["dion summary form"] == [0.1, 0.3, 0.5, 0.7, 1.0]
    assert betas["orth_dion code form"] == [0.05, 0.1, 0.3, 0.5, 0.7, 1.0]  # 0.05: the default mu = 0.95
    assert points.groupby("line").size().to_dict() == {"dion code form": 18, "dion summary form": 15,
                                                       "orth_dion code form": 18, "orth_dion summary form": 15}
    shared = points[points["beta"] == 1.0].groupby("seed")["final_val_loss"].nunique()
    assert (shared == 2).all()  # per seed, one dion and one orth_dion run at beta = 1, on both lines


def test_the_gap_figure_draws_each_rows_gap_and_interval_beside_the_papers(tmp_path):
    """A `gap` table of two DiLoCo rows against ddp and one MuLoCo row against muon: one line per baseline, its
    points at the rows' worker counts and gaps, and the paper's gaps as crosses."""
    table = pd.DataFrame({"label": ["ddp", "diloco_M1", "diloco_M4", "muloco_M1"], "train.devices": [4, 1, 4, 1],
                          "baseline": [None, "ddp", "ddp", "muon"], "gap_pct": [None, -0.5, 2.5, 0.3],
                          "gap_pct_low": [None, -1.0, 2.0, -0.1], "gap_pct_high": [None, 0.0, 3.0, 0.7],
                          "paper_gap_pct": [None, -0.1, 2.0, None]})
    stored = ResultsStore(tmp_path).preset("diloco_scaling", "claim")
    stored.dir.mkdir(parents=True)
    table.to_csv(stored.dir / "table.csv", index=False)
    fig = plt.figure()
    figures.draw_gap(fig, stored, TableSpec.parse({"kind": "gap", "settings": ["train.devices"], "gaps": []}))
    ax, = fig.axes
    lines = {bars.get_label(): bars.lines[0] for bars in ax.containers}  # each errorbar's line through its means
    assert list(lines["against ddp"].get_xdata()) == [1, 4] and list(lines["against ddp"].get_ydata()) == [-0.5, 2.5]
    crosses = [c.get_offsets().tolist() for c in ax.collections if c.get_label() == "the paper, against ddp"]
    assert crosses == [[[1.0, -0.1], [4.0, 2.0]]]
    assert list(lines["against muon"].get_ydata()) == [0.3]
    plt.close(fig)
