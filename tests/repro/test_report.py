"""`make report`: the README sections are the generated ones, and the verdicts of the experiments' claims (their
configs' `claims:`) follow the stored tables."""

from pathlib import Path

import pandas as pd
import pytest

from lowcomm.repro import report
from lowcomm.repro.spec import reported
from lowcomm.repro.store import ResultsStore
from lowcomm.repro.judge import NO_VERDICT, NOT_REPRODUCED, NOT_TESTABLE, PENDING, REPRODUCED
from lowcomm.repro.stats import EQUIVALENT, INCONCLUSIVE, TOO_FEW

ROOT = Path(__file__).resolve().parents[2]
SPECS = reported()


def judged(results: Path, name: str) -> list:
    """The experiment's claims judged on the results stored under `results`."""
    return report.judged(ResultsStore(results), SPECS[name])


def comparison(a: str, b: str, verdict: str, metric: str = "final_val_loss", diff: float = 0.1, n: int = 3) -> dict:
    """A comparisons.csv row of the paired rule (n seeds)."""
    return {"a": a, "b": b, "metric": metric, "n": n, "diff": diff, "ci_low": diff - 0.05, "ci_high": diff + 0.05,
            "unpaired_seeds": "", "verdict": verdict}


def write(root: Path, name: str, preset: str, rows: list[dict], comparisons: list[dict] = ()) -> Path:
    out = root / name / preset
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(out / "table.csv", index=False)
    if comparisons:
        pd.DataFrame(list(comparisons)).to_csv(out / "comparisons.csv", index=False)
    return out


def test_readme_sections_are_generated_from_the_stored_results():
    for path, text in report.generated_files(ROOT).items():
        assert path.read_text() == text, f"{path} differs from its generated sections: run `make report`"


def test_without_stored_tables_every_claim_is_pending(tmp_path):
    for name in (spec.name for spec in report.with_claims(SPECS)):
        claims = judged(tmp_path, name)
        assert claims and {c.verdict for c in claims} == {PENDING}, name
        assert all(c.ours.startswith("not stored yet: `make ") and not c.setting for c in claims), name
    assert judged(tmp_path, "table3_main")[0].ours == \
        "not stored yet: `make table3_main PRESET=claim OUT=results`"
    assert judged(tmp_path, "communication")[0].ours == "not stored yet: `make accounting OUT=results`"
    assert "The cpu run is pending: `make rank_sweep OUT=results`" in report.experiment_section(ResultsStore(tmp_path), SPECS["rank_sweep"])
    assert "cpu" not in report.experiment_section(ResultsStore(tmp_path), SPECS["lordo_balance"])  # it has no cpu preset
    assert "The crossover table is pending: `make accounting OUT=results`" in \
        report.experiment_section(ResultsStore(tmp_path), SPECS["communication"])
    assert "- [table3_main](experiments/table3_main/README.md): pending (`make table3_main OUT=results`)" in \
        report.readme_section(ResultsStore(tmp_path), SPECS)


def write_table3(root: Path, verdicts: dict[tuple[str, str], str], preset: str = "claim", seeds: int = 5,
                 steps: int = 1024, labels: tuple[str, ...] | None = None) -> None:
    # label: (loss, ppl, bytes / ddp's, bytes / lowrank_ddp's, state / AdamW's)
    rows = {"ddp": (4.0, 90.0, 1.0, 2.5, 1.0), "lowrank_ddp": (4.1, 100.0, 0.4, 1.0, 0.4),
            "lordo": (4.2, 105.0, 1 / 25.5, 1 / 6.8, 0.4), "lordo_local": (4.3, 110.0, 1 / 30, 1 / 8, 0.4),
            "lordo_global_noqh": (4.4, 120.0, 1 / 25.5, 1 / 6.8, 0.4), "local_adam": (4.3, 110.0, 1 / 10, 1 / 4, 1.0)}
    # state bytes by kind, as the records hold them (the cpu size's, MB)
    memory = {"ddp": {"adamw_moments": 10.5}, "local_adam": {"adamw_moments": 10.5, "anchor": 5.25},
              "lordo": {"moments": 0.8, "bases": 0.2, "error_feedback": 3.15, "anchor": 5.25, "adamw_moments": 4.2}}
    write(root, "table3_main", preset, [
        {"label": k, "method": k, **{f"memory/{kind}_bytes": mb * 1e6 for kind, mb in memory.get(k, {}).items()},
         "final_val_loss": loss, "final_val_loss_std": 0.01, "final_val_ppl": ppl, "final_val_ppl_std": 1.0,
         "seeds": seeds, "steps": steps, "world_size": 4, "tokens": steps * 4 * 1024, "parameters": 1.2e6,
         "bytes_ratio_to_ddp": to_ddp, "bytes_ratio_to_lowrank_ddp": to_lr, "matrix_moments_ratio": 8.0,
         "state_ratio_to_adamw": state}
        for k, (loss, ppl, to_ddp, to_lr, state) in rows.items() if labels is None or k in labels],
        [comparison(a, b, v, n=seeds) for (a, b), v in verdicts.items()])


# table3_main's claim preset: its horizon and where its lrs come from (no method_overrides: every row at its preset)
CLAIM_SETTING = "claim preset, 1,024 steps, tuned lrs"


def test_table3_verdicts_follow_the_stored_numbers(tmp_path):
    write_table3(tmp_path, {("lordo", "lordo_local"): "lower", ("lordo", "lowrank_ddp"): "higher",
                            ("lordo_global_noqh", "lordo"): "inconclusive"})
    claims = judged(tmp_path, "table3_main")
    assert [c.verdict for c in claims] == [REPRODUCED, NOT_REPRODUCED, REPRODUCED, NOT_REPRODUCED, NOT_TESTABLE,
                                           REPRODUCED, INCONCLUSIVE]
    assert {c.setting for c in claims} == {CLAIM_SETTING}
    assert "1024 tokens per worker-step and 1.2M parameters here" in claims[4].ours
    assert "lordo - lordo_local = 0.1 [0.05, 0.15] nats (n = 5 paired seeds)" in claims[5].ours
    assert claims[0].ours.startswith("25.5x") and claims[1].ours.startswith("6.8x")
    assert "(5 %)" in claims[4].ours and "lordo 2.5x" in claims[2].ours  # whole model: 1 / 0.4
    # every state counted: 10.5 MB (ddp) and 15.75 MB (local_adam) against lordo's 13.6 MB
    assert claims[3].ours.startswith("ddp / lordo = 0.772x (10.5 / 13.6); local_adam / lordo = 1.16x (15.75 / 13.6)")


def test_table3_claims_are_pending_until_the_claim_preset_holds_their_rows(tmp_path):
    write_table3(tmp_path, {("lordo", "lordo_local"): "lower"}, preset="cpu", seeds=3, steps=256)
    write_table3(tmp_path, {}, labels=("ddp", "lowrank_ddp"))
    partial = judged(tmp_path, "table3_main")
    assert {c.verdict for c in partial} == {PENDING}  # every claim reads lordo, which the claim preset lacks
    assert partial[5].ours == "not stored yet: `make table3_main PRESET=claim OUT=results`"
    write_table3(tmp_path, {("lordo", "lordo_local"): "higher"})
    full = judged(tmp_path, "table3_main")
    assert full[5].verdict == NOT_REPRODUCED and full[5].setting == CLAIM_SETTING
    assert f"| {CLAIM_SETTING} |" in report.claims_markdown([("table3_main", full[5])], True)
    for preset in ("claim", "cpu"):
        (tmp_path / "table3_main" / preset / "table.md").write_text("### table\n")
    line = report.experiment_line(ResultsStore(tmp_path, tmp_path / "figures"), "table3_main")
    assert f"claim [table]({tmp_path}/table3_main/claim/table.md); cpu [table]({tmp_path}/table3_main/cpu/table.md)" \
        in line


def test_claim_preset_verdicts_wait_for_five_paired_seeds(tmp_path):
    write_table3(tmp_path, {("lordo", "lordo_local"): "higher", ("lordo_global_noqh", "lordo"): "higher"}, seeds=3)
    claims = judged(tmp_path, "table3_main")
    assert claims[5].verdict == "pending: 3 of 5 paired seeds (not reproduced so far)"
    assert claims[6].verdict == "pending: 3 of 5 paired seeds (reproduced so far)"
    assert "(n = 3 paired seeds)" in claims[5].ours and claims[0].verdict == REPRODUCED


def test_a_readme_without_markers_is_an_error(tmp_path):
    path = tmp_path / "README.md"
    with pytest.raises(ValueError, match="has no generated section"):
        report.replace_between("# title\n", report.README_MARKERS, "body", path)
    text = f"a\n{report.README_MARKERS[0]}\nold\n{report.README_MARKERS[1]}\nb\n"
    assert report.replace_between(text, report.README_MARKERS, "new", path) == \
        f"a\n{report.README_MARKERS[0]}\nnew\n{report.README_MARKERS[1]}\nb\n"


def test_spectral_verdicts_answer_the_questions_and_the_probe_claim_is_paired(tmp_path):
    labels = ["ddp", "diloco", "lordo", "muloco", "orth_dion_local", "lordo_orth_dion"]
    write(tmp_path, "spectral_local_steps", "cpu",
          [{"label": k, "method": k, "final_val_loss": 4.0, "seeds": 3, "steps": 384, "bytes_ratio_to_ddp": 1 / 32}
           for k in labels],
          [comparison("muloco", "diloco", "lower"), comparison("orth_dion_local", "lordo", "higher"),
           comparison("lordo_orth_dion", "orth_dion_local", "equivalent")])
    claims = judged(tmp_path, "spectral_local_steps")
    assert [c.verdict for c in claims] == [REPRODUCED, "lordo lower", EQUIVALENT, PENDING]
    assert "fewer bytes than ddp: muloco 32x, diloco 32x" in claims[0].ours and "PRESET=probe_paired" in claims[3].ours
    cosine = "probe_cosine_mean_over_syncs"
    rows = [{"label": k, "method": k, "final_val_loss": 4.0, "seeds": 3, "steps": 384, cosine: v}
            for k, v in (("diloco", 0.4), ("muloco", 0.6))]
    for verdict, n, expected in (("higher", 3, REPRODUCED), ("lower", 3, NOT_REPRODUCED), (TOO_FEW, 1, NO_VERDICT)):
        write(tmp_path, "spectral_local_steps", "probe_paired", rows,
              [comparison("muloco", "diloco", verdict, cosine, diff=0.2, n=n)])
        claim = judged(tmp_path, "spectral_local_steps")[3]
        assert claim.verdict == expected, verdict
    assert claim.ours == ("muloco - diloco = 0.2 [0.15, 0.25] (n = 1 paired seed); mean cosine over the syncs: "
                          "muloco 0.6, diloco 0.4")
    settings = [c.setting for c in judged(tmp_path, "spectral_local_steps")]
    assert settings == ["cpu preset, 384 steps, tuned lrs, lordo at optim.qh_scale=1.0"] * 3 + [
        "probe_paired preset, 384 steps, tuned lrs"]


def write_convergence(root: Path, orth_reached: int, verdicts: dict[tuple[str, str, str], str]) -> None:
    steps = {"dion": 512.0, "orth_dion": 448.0 if orth_reached else float("nan"), "ada_orth_dion": 480.0}
    reached = {"dion": 3, "orth_dion": orth_reached, "ada_orth_dion": 3}
    write(root, "orthdion_convergence", "cpu",
          [{"label": k, "method": k, "seeds": 3, "final_val_loss": 3.7, "final_val_loss_std": 0.01,
            "steps_to_target": v, "steps_to_target_n": reached[k], "time_to_target_s": 0.5 * v,
            "time_to_target_s_n": reached[k], "active_rank_share_over_training": 0.9 if k == "ada_orth_dion" else 1.0}
           for k, v in steps.items()],
          [comparison(a, b, v, m, -64.0) for (a, b, m), v in verdicts.items()])


def test_convergence_claims_compare_final_losses_when_orth_dion_never_reaches_the_target(tmp_path):
    write_convergence(tmp_path, 0, {("orth_dion", "dion", "final_val_loss"): "inconclusive",
                                    ("ada_orth_dion", "orth_dion", "final_val_loss"): "equivalent"})
    claims = judged(tmp_path, "orthdion_convergence")
    assert [c.verdict for c in claims] == [NOT_REPRODUCED, NOT_REPRODUCED, REPRODUCED]
    assert "in 3 of 3 seeds" in claims[0].ours and "orth_dion - dion = -64" in claims[0].ours
    assert "n/a" not in claims[0].ours + claims[1].ours


def test_convergence_claims_follow_the_steps_and_time_comparisons(tmp_path):
    write_convergence(tmp_path, 3, {("orth_dion", "dion", "steps_to_target"): "lower",
                                    ("orth_dion", "dion", "time_to_target_s"): "inconclusive",
                                    ("ada_orth_dion", "orth_dion", "final_val_loss"): "higher"})
    claims = judged(tmp_path, "orthdion_convergence")
    assert [c.verdict for c in claims] == [REPRODUCED, INCONCLUSIVE, NOT_REPRODUCED]
    assert claims[0].ours.startswith("12.5 % fewer (448 vs 512 steps)")
    assert claims[2].ours.startswith("ada_orth_dion active_rank_share_over_training 0.9")


def test_compressed_claims_read_the_paired_comparisons_bytes_and_the_goal(tmp_path):
    # label: bytes per step as a share of ddp's
    shares = {"ddp": 1.0, "diloco": 1 / 32, "lordo": 1 / 26, "sparseloco_d1": 1 / 3000, "sparseloco_d3": 1 / 1100,
              "diloco_4bit": 1 / 256, "lordo_compressed": 1 / 130, "lordo_compressed_local_moments": 1 / 2600,
              "muloco_compressed": 1 / 3000}
    rows = [{"label": k, "method": k, "final_val_loss": 4.0, "seeds": 3, "steps": 1024,
             "bytes_per_step/total": 1e7 * v, "bytes_ratio_to_ddp": v} for k, v in shares.items()]
    verdicts = {("sparseloco_d1", "diloco"): "equivalent", ("sparseloco_d3", "diloco"): "lower",
                ("lordo_compressed", "lordo"): "inconclusive", ("lordo_compressed_local_moments", "lordo"): "lower",
                ("diloco_4bit", "diloco"): "lower", ("lordo_compressed", "diloco"): "higher",
                ("lordo_compressed_local_moments", "diloco"): "higher", ("muloco_compressed", "diloco"): "higher"}
    write(tmp_path, "compressed_sync", "cpu", rows, [comparison(a, b, v) for (a, b), v in verdicts.items()])
    claims = judged(tmp_path, "compressed_sync")
    assert claims[0].verdict == REPRODUCED  # equivalent and lower: no worse
    assert claims[1].verdict == NOT_REPRODUCED and "lordo / lordo_compressed = 5x" in claims[1].ours  # 130 / 26 < 10
    assert claims[2].verdict == REPRODUCED and "lordo / lordo_compressed_local_moments = 100x" in claims[2].ours
    assert claims[3].verdict == "reached by sparseloco_d1, sparseloco_d3"  # d3: 1/1100 of ddp's bytes
    verdicts[("sparseloco_d1", "diloco")] = verdicts[("sparseloco_d3", "diloco")] = "higher"
    write(tmp_path, "compressed_sync", "cpu", rows, [comparison(a, b, v) for (a, b), v in verdicts.items()])
    claims = judged(tmp_path, "compressed_sync")
    assert claims[0].verdict == NOT_REPRODUCED and claims[3].verdict == "not reached"


def test_nu_claims_rise_by_the_paired_rule_and_show_each_interval(tmp_path):
    rows = [{"label": f"{m}_rf{f}", "method": m, "rank": r, "sqrt_rank": r ** 0.5, "seeds": 3,
             "nu_mean_over_training": value, "nu_mean_over_training_std": 0.003,
             "nu_max_over_training": value + 0.5 * (m == "dion")}
            for m, base in (("dion", 1.3), ("orth_dion", 1.0)) for f, r, value in
            ((0.125, 16, base), (0.25, 32, base + 0.1 * (m == "dion")))]
    nu = "nu_mean_over_training"
    write(tmp_path, "nu_measurement", "cpu", rows, [comparison("dion_rf0.25", "dion_rf0.125", "higher", nu)])
    rising, one = judged(tmp_path, "nu_measurement")
    assert rising.verdict == REPRODUCED and one.verdict == REPRODUCED
    assert "dion_rf0.25 - dion_rf0.125 = 0.1 [0.05, 0.15] (n = 3 paired seeds)" in rising.ours
    assert rising.ours.startswith("rank 16: 1.3 +- 0.003; rank 32: 1.4 +- 0.003")
    assert one.ours == ("largest distance of nu_max_over_training from 1 over orth_dion_rf0.125, orth_dion_rf0.25 "
                        "(3 seeds): 0; ranks: orth_dion_rf0.125 16, orth_dion_rf0.25 32")
    write(tmp_path, "nu_measurement", "cpu", rows, [comparison("dion_rf0.25", "dion_rf0.125", INCONCLUSIVE, nu)])
    assert judged(tmp_path, "nu_measurement")[0].verdict == INCONCLUSIVE
    rows[-1]["nu_max_over_training"] = 1.01
    write(tmp_path, "nu_measurement", "cpu", rows)
    assert judged(tmp_path, "nu_measurement")[1].verdict == NOT_REPRODUCED
