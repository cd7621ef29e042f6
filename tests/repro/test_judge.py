"""lowcomm.repro.judge: each rule on a synthetic stored table with a known answer, the parse errors, every
experiment's claims, and no reproduction module naming an experiment or a row."""

import ast
import re
from pathlib import Path

import pandas as pd
import pytest

from lowcomm.config import ConfigError
from lowcomm.cost.state import OPTIMIZER_FAMILIES
from lowcomm.repro import judge as j
from lowcomm.repro.judge import NO_VERDICT, NOT_REPRODUCED, NOT_TESTABLE, PENDING, REPRODUCED, Stored
from lowcomm.repro.spec import experiments
from lowcomm.repro.store import ResultsStore
from lowcomm.repro.stats import EQUIVALENT, HIGHER, INCONCLUSIVE, LOWER, TOO_FEW

ROOT = Path(__file__).resolve().parents[2]


def comparison(a: str, b: str, verdict: str, metric: str = "final_val_loss", diff: float = 0.1, n: int = 3,
               **more) -> dict:
    """A comparisons.csv row of the paired rule (n seeds)."""
    return {"a": a, "b": b, "metric": metric, "n": n, "diff": diff, "ci_low": diff - 0.05, "ci_high": diff + 0.05,
            "unpaired_seeds": "", "verdict": verdict, **more}


def stored(root: Path, rows: list[dict], comparisons: list[dict] = (), preset: str = "cpu",
           analytic: list[dict] = ()) -> Stored:
    """The tables of experiment `x` at `preset` (rows default to method = label and 3 seeds)."""
    out = root / "x" / preset
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame([{"method": r["label"], "seeds": 3, **r} for r in rows]).to_csv(out / "table.csv", index=False)
    if comparisons:
        pd.DataFrame(list(comparisons)).to_csv(out / "comparisons.csv", index=False)
    if analytic:
        pd.DataFrame(list(analytic)).to_csv(root / "x" / "analytic.csv", index=False)
    return Stored(ResultsStore(root).preset("x", preset))


def judged(s: Stored, **entry) -> j.Claim:
    """The verdict of one claim entry (paper, source and setting filled in) on `s`."""
    spec = j.parse_claims([{"paper": "p", "source": {"paper": "P"}, "setting": "synthetic", **entry}], "x.yaml")[0]
    return j.judge(spec, s)


# ------------------------------------------------------------------------------------------ paired rules

@pytest.mark.parametrize("rule, got, verdict", [
    ("lower", LOWER, REPRODUCED), ("lower", HIGHER, NOT_REPRODUCED), ("lower", EQUIVALENT, EQUIVALENT),
    ("lower", TOO_FEW, NO_VERDICT), ("higher", HIGHER, REPRODUCED), ("higher", INCONCLUSIVE, INCONCLUSIVE),
    ("equivalent", EQUIVALENT, REPRODUCED), ("equivalent", LOWER, NOT_REPRODUCED),
    ("no_worse", EQUIVALENT, REPRODUCED), ("no_worse", LOWER, REPRODUCED), ("no_worse", HIGHER, NOT_REPRODUCED),
    ("outcome", LOWER, "a lower"), ("outcome", HIGHER, "b lower"), ("outcome", EQUIVALENT, EQUIVALENT)])
def test_paired_rules_follow_the_paired_verdict(tmp_path, rule, got, verdict):
    s = stored(tmp_path, [{"label": "a"}, {"label": "b"}], [comparison("a", "b", got)])
    claim = judged(s, rule=rule, pairs=[["a", "b"]])
    assert claim.verdict == verdict and claim.ours == "a - b = 0.1 [0.05, 0.15] nats (n = 3 paired seeds)"
    assert claim.setting == "synthetic"


def test_the_setting_names_the_commits_of_the_tables_runs(tmp_path):
    rows = [{"label": "a", "commits": "1a2b3c4d5e 9f8e7d6c5b-dirty"}, {"label": "b", "commits": "1a2b3c4d5e"}]
    s = stored(tmp_path, rows, [comparison("a", "b", LOWER)],
               analytic=[{"size": "s1", "method": "a", "over_a": 24.0}])
    assert judged(s, rule="lower", pairs=[["a", "b"]]).setting == "synthetic, runs at commits 1a2b3c4 9f8e7d6-dirty"
    analytic = judged(s, rule="ratio_about", row="a", column="over_a", factor=25, band=0.3, sizes=["s1"])
    assert analytic.verdict == REPRODUCED and analytic.setting == "synthetic"  # no run made the analytic table


def test_the_default_setting_names_the_presets_steps_lrs_and_method_overrides(tmp_path):
    rows = [{"label": "a", "steps": 1024}, {"label": "b", "steps": 1024}]
    stored(tmp_path, rows, [comparison("a", "b", LOWER)], preset="claim")
    pinned = {"m": ("optim.x=1",), "n": ("optim.x=1",), "o": ("optim.y=2", "optim.z=3")}
    s = Stored(ResultsStore(tmp_path).preset("x", "claim"), ("lr",), pinned)
    claim = j.judge(j.parse_claims([{"paper": "p", "source": {"paper": "P"}, "rule": "lower", "pairs": [["a", "b"]]}],
                                   "x.yaml")[0], s)
    assert claim.setting == ("claim preset, 1,024 steps, tuned lrs, m and n at optim.x=1, o at optim.y=2 optim.z=3")
    earlier = Stored(ResultsStore(tmp_path).preset("x", "claim"), ("lr",), tuned_from="v1")
    assert j.judge(j.parse_claims([{"paper": "p", "source": {"paper": "P"}, "rule": "lower", "pairs": [["a", "b"]]}],
                                  "x.yaml")[0], earlier).setting == "claim preset, 1,024 steps, tuned lrs of protocol v1"
    nonmatrix = Stored(ResultsStore(tmp_path).preset("x", "claim"), ("adamw_lr",), tuned_from="v1")
    assert nonmatrix.setting == "claim preset, 1,024 steps, lrs named in its config, tuned adamw_lr of protocol v1"
    s = stored(tmp_path, [{"label": "a", "commits": "1a2b3c4d5e"}, {"label": "b", "commits": "1a2b3c4d5e"}],
               [comparison("a", "b", LOWER)])
    assert judged(s, rule="lower", pairs=[["a", "b"]]).setting == "synthetic, runs at commit 1a2b3c4"


def test_paired_pairs_combine_and_min_seeds_holds_a_verdict_pending(tmp_path):
    s = stored(tmp_path, [{"label": k} for k in "abc"], [comparison("a", "b", LOWER), comparison("a", "c", HIGHER),
                                                         comparison("c", "b", LOWER, n=5)])
    assert judged(s, rule="lower", pairs=[["a", "b"], ["a", "c"]]).verdict == NOT_REPRODUCED
    assert judged(s, rule="lower", pairs=[["a", "b"], ["c", "b"]]).verdict == REPRODUCED
    assert judged(s, rule="lower", pairs=[["a", "c"]], min_seeds=5).verdict == \
        "pending: 3 of 5 paired seeds (not reproduced so far)"
    assert judged(s, rule="lower", pairs=[["c", "b"]], min_seeds=5).verdict == REPRODUCED
    # several comparisons: merged first, then held while the one with the fewest seeds is short of min_seeds
    assert judged(s, rule="lower", pairs=[["a", "b"], ["a", "c"]], min_seeds=5).verdict == \
        "pending: 3 of 5 paired seeds (not reproduced so far)"
    assert judged(s, rule="lower", pairs=[["c", "b"], ["a", "b"]], min_seeds=5).verdict == \
        "pending: 3 of 5 paired seeds (reproduced so far)"
    assert j.combine([REPRODUCED, "pending: 3 of 5 paired seeds (reproduced so far)"]) == PENDING


def test_paired_sides_at_a_sweep_value_and_method_pairs_at_the_smallest_values(tmp_path):
    rows = [{"label": f"{m}_r{v}", "method": m, "sweep_value": v} for m in ("g", "l") for v in (8, 16, 32)]
    c = [comparison(f"g_r{v}", f"l_r{v}", verdict, sweep_value=v)
         for v, verdict in ((32, HIGHER), (16, LOWER), (8, LOWER))]
    s = stored(tmp_path, rows, c)
    claim = judged(s, rule="lower", pairs=[["g", "l"]], smallest=2)
    assert claim.verdict == REPRODUCED and claim.ours.startswith("8: g_r8 - l_r8 = 0.1") and "16: g_r16" in claim.ours
    assert judged(s, rule="lower", pairs=[["g", "l"]], smallest=3).verdict == NOT_REPRODUCED
    at = judged(s, rule="higher", pairs=[[{"method": "g", "at": 32}, {"method": "l", "at": 32.0}]])
    assert at.verdict == REPRODUCED and at.ours.startswith("g_r32 - l_r32")


def test_open_question_lists_every_answer_and_waits_for_one(tmp_path):
    rows = [{"label": f"{m}_r{v}", "method": m, "sweep_value": v} for m in ("q", "g", "l") for v in (8, 16)]
    c = [comparison(f"q_r{v}", f"g_r{v}", verdict, sweep_value=v) for v, verdict in ((16, HIGHER), (8, LOWER))]
    claim = judged(stored(tmp_path, rows, c), rule="open_question", a_methods=["q"], question="D1", note="q: no E")
    assert claim.verdict == "open question (D1), answered by the numbers"
    assert claim.ours == ("8: q_r8 - g_r8 = 0.1 [0.05, 0.15] nats (n = 3 paired seeds) (lower); "
                          "16: q_r16 - g_r16 = 0.1 [0.05, 0.15] nats (n = 3 paired seeds) (higher) (q: no E)")
    assert judged(stored(tmp_path, rows, c), rule="open_question", a_methods=["l"], question="D1").verdict == PENDING


# ------------------------------------------------------------------------------------------ value rules

@pytest.mark.parametrize("share, factor, band, verdict", [(1 / 26.7, 25, 0.3, REPRODUCED),
                                                         (1 / 6.8, 10, 0.3, NOT_REPRODUCED),
                                                         (1 / 12.5, 10, 0.3, REPRODUCED),
                                                         (1 / 12.5, 10, 0.2, NOT_REPRODUCED)])
def test_ratio_about_is_within_the_stated_band(tmp_path, share, factor, band, verdict):
    s = stored(tmp_path, [{"label": "a", "bytes_ratio": share}])
    claim = judged(s, rule="ratio_about", row="a", column="bytes_ratio", invert=True, factor=factor, band=band,
                   note="measured")
    assert claim.verdict == verdict and claim.ours == f"{j.num(1 / share, 3)}x measured"


def test_ratio_about_over_other_rows_counts_every_state_column(tmp_path):
    memory = {"a": {"moments": 0.8, "anchor": 5.2}, "b": {"moments": 48.0}, "c": {"moments": 6.0}}
    rows = [{"label": k, **{f"memory/{kind}_bytes": mb * 1e6 for kind, mb in m.items()}} for k, m in memory.items()]
    s = stored(tmp_path, rows)
    claim = judged(s, rule="ratio_about", row="a", column="whole_state_mb", over=["b"], factor=8, band=0.3)
    assert claim.verdict == REPRODUCED and claim.ours == "b / a = 8x (48 / 6)"
    assert judged(s, rule="ratio_about", row="a", column="whole_state_mb", over=["b", "c"], factor=8,
                  band=0.3).verdict == NOT_REPRODUCED


def test_ratio_about_at_model_sizes_reads_the_analytic_table(tmp_path):
    analytic = [{"size": size, "method": "a", "over_a": v} for size, v in (("s1", 24.0), ("s2", 27.0), ("s3", 5.0))]
    s = stored(tmp_path, [{"label": "a"}], analytic=analytic)
    claim = judged(s, rule="ratio_about", row="a", column="over_a", factor=25, band=0.3, sizes=["s1", "s2"],
                   show=[{"values": "over_a", "rows": ["a"], "unit": "x", "text": "again"}])
    assert claim.verdict == REPRODUCED and claim.ours == "s1: 24x; s2: 27x; again: s1 a 24x, s2 a 27x"
    assert judged(s, rule="ratio_about", row="a", column="over_a", factor=25, band=0.3,
                  sizes=["s1", "s3"]).verdict == NOT_REPRODUCED
    assert judged(s, rule="ratio_about", row="a", column="over_a", factor=25, band=0.3, sizes=["s4"],
                  command="make tables").ours == "not stored yet: `make tables`"


@pytest.mark.parametrize("n, half_width, got, due", [(5, 0.06, INCONCLUSIVE, True), (5, 0.04, INCONCLUSIVE, False),
                                                     (10, 0.06, INCONCLUSIVE, False), (3, 0.06, INCONCLUSIVE, False),
                                                     (5, 0.06, HIGHER, False)])
def test_an_inconclusive_claim_wider_than_the_rule_goes_to_ten_seeds_once(tmp_path, n, half_width, got, due):
    row = {**comparison("a", "b", got, n=n), "ci_low": 0.1 - half_width, "ci_high": 0.1 + half_width}
    claim = judged(stored(tmp_path, [{"label": "a"}, {"label": "b"}], [row]), rule="lower", pairs=[["a", "b"]])
    assert claim.ours.endswith(f"; half-width {j.num(half_width, 2)} > 0.05 at n = {n}: to n = 10 once, by rule") == due


@pytest.mark.parametrize("theirs, verdict", [(1.2e6, REPRODUCED), (6e5, NOT_REPRODUCED)])
def test_at_least(tmp_path, theirs, verdict):
    s = stored(tmp_path, [{"label": "a", "bytes": 1e5}, {"label": "b", "bytes": theirs}])
    claim = judged(s, rule="at_least", row="a", column="bytes", over=["b"], least=10)
    assert claim.verdict == verdict and claim.ours.startswith(f"b / a = {j.num(theirs / 1e5, 3)}x")


@pytest.mark.parametrize("slowest, verdict", [(0.4, REPRODUCED), (0.01, NOT_REPRODUCED), (float("nan"), PENDING)])
def test_each_at_least_judges_the_smallest_row_of_a_method(tmp_path, slowest, verdict):
    rows = [{"label": f"m_{w}", "method": "m", "angle": v} for w, v in ((0.7, 1.5), (0.9, slowest))]
    claim = judged(stored(tmp_path, [*rows, {"label": "n", "angle": 0.001}]), rule="each_at_least", method="m",
                   column="angle", least=0.015, note="rad")
    assert claim.verdict == verdict
    shown = "m_0.7 1.5" if verdict == PENDING else f"m_0.9 {j.num(slowest, 3)}"
    assert claim.ours == f"smallest angle over 2 rows: {shown}, against 0.015 (rad)"


@pytest.mark.parametrize("still, moving, verdict", [(0.001, 1.5, REPRODUCED), (0.02, 1.5, NOT_REPRODUCED),
                                                    (0.005, 0.04, NOT_REPRODUCED), (float("nan"), 1.5, PENDING)])
def test_stays_below_a_bound_and_a_share_of_another_row(tmp_path, still, moving, verdict):
    s = stored(tmp_path, [{"label": "a", "angle_max": still}, {"label": "b", "angle_median": moving}])
    claim = judged(s, rule="stays_below", row="a", column="angle_max", below=0.01, than_row="b",
                   than_column="angle_median", share=0.1, note="rad")
    assert claim.verdict == verdict and claim.ours == f"a angle_max {j.num(still, 3)}, b angle_median {moving} (rad)"


@pytest.mark.parametrize("worst, verdict", [(1.0 + 4e-7, REPRODUCED), (1.01, NOT_REPRODUCED)])
def test_stays_within_for_every_row_of_a_method(tmp_path, worst, verdict):
    rows = [{"label": f"o_{r}", "method": "o", "nu": v} for r, v in ((16, 1.0), (32, worst))]
    s = stored(tmp_path, [*rows, {"label": "d", "nu": 3.0}])
    claim = judged(s, rule="stays_within", method="o", column="nu", of=1.0, within=1e-3)
    assert claim.verdict == verdict
    assert claim.ours == f"largest distance of nu from 1 over o_16, o_32 (3 seeds): {j.num(worst - 1, 3)}"


@pytest.mark.parametrize("steps, verdict", [((HIGHER, HIGHER), REPRODUCED), ((HIGHER, INCONCLUSIVE), INCONCLUSIVE),
                                            ((LOWER, HIGHER), NOT_REPRODUCED)])
def test_increases_along_pairs_consecutive_rows(tmp_path, steps, verdict):
    rows = [{"label": f"d_{r}", "method": "d", "rank": r, "nu": 1 + r / 100, "nu_std": 0.003} for r in (64, 16, 32)]
    c = [comparison(b, a, got, "nu") for (a, b), got in zip((("d_16", "d_32"), ("d_32", "d_64")), steps)]
    claim = judged(stored(tmp_path, rows, c), rule="increases_along", method="d", column="nu", along="rank")
    assert claim.verdict == verdict
    assert claim.ours.startswith("rank 16: 1.16 +- 0.003; rank 32: 1.32 +- 0.003; rank 64: 1.64 +- 0.003 (nu); d_32 - ")


def test_increases_along_orders_a_list_of_rows_by_a_config_column_and_refuses_two_at_one_value(tmp_path):
    """DiLoCo at M = 1, 2, 4 against one baseline: the rows of three labels in order of train.devices; a MuLoCo row
    at M = 1 beside DiLoCo's has no order."""
    rows = [{"label": f"diloco_M{m}", "train.devices": m, "final_val_loss": 4 + m / 100} for m in (4, 1, 2)]
    rows.append({"label": "muloco_M1", "train.devices": 1, "final_val_loss": 3.9})
    c = [comparison("diloco_M2", "diloco_M1", HIGHER), comparison("diloco_M4", "diloco_M2", HIGHER)]
    s = stored(tmp_path, rows, c)
    claim = judged(s, rule="increases_along", method=["diloco_M4", "diloco_M1", "diloco_M2"],
                   column="final_val_loss", along="train.devices")
    assert claim.verdict == REPRODUCED and claim.ours.startswith("train.devices 1: 4.01")
    assert "diloco_M2 - diloco_M1" in claim.ours and "diloco_M4 - diloco_M2" in claim.ours
    with pytest.raises(ConfigError, match=r"share a value of train.devices \(\[1.0, 1.0, 2.0, 4.0\]\)"):
        judged(s, rule="increases_along", method=["diloco_M4", "diloco_M1", "diloco_M2", "muloco_M1"],
               column="final_val_loss", along="train.devices")


def test_reaches_sooner_and_the_seeds_that_never_reach(tmp_path):
    def rows(reached: int) -> list[dict]:
        return [{"label": "o", "steps_to_target": 448.0 if reached else float("nan"), "steps_to_target_n": reached},
                {"label": "d", "steps_to_target": 512.0, "steps_to_target_n": 3}]
    c = [comparison("o", "d", LOWER, "steps_to_target", -64.0), comparison("o", "d", INCONCLUSIVE, diff=0.02)]
    claim = judged(stored(tmp_path, rows(3), c), rule="reaches_sooner", a="o", b="d", metric="steps_to_target",
                   unit="steps")
    assert claim.verdict == REPRODUCED and claim.ours.startswith("12.5 % fewer (448 vs 512 steps); o - d = -64")
    c[0] = comparison("o", "d", HIGHER, "steps_to_target", 64.0)
    assert judged(stored(tmp_path, rows(3), c), rule="reaches_sooner", a="o", b="d", metric="steps_to_target",
                  unit="steps").verdict == NOT_REPRODUCED
    never = judged(stored(tmp_path, rows(0), c), rule="reaches_sooner", a="o", b="d", metric="steps_to_target",
                   unit="steps")
    assert never.verdict == NOT_REPRODUCED and never.ours == (
        "did not reach it within the run in 3 of 3 seeds; final validation loss: o - d = 0.02 [-0.03, 0.07] nats "
        "(n = 3 paired seeds)")


def test_goal_is_reached_by_the_rows_under_the_bytes_and_no_worse(tmp_path):
    shares = {"ref": 1 / 32, "s1": 1 / 3000, "s2": 1 / 1100, "big": 1 / 200}
    rows = [{"label": k, "bytes_ratio": v} for k, v in shares.items()]

    def goal(verdicts: dict[str, str]) -> j.Claim:
        c = [comparison(k, "ref", v) for k, v in verdicts.items()]
        return judged(stored(tmp_path, rows, c), rule="goal", rows=["s1", "s2", "big"], column="bytes_ratio",
                      invert=True, least=1000, against="ref", note="fewer bytes")
    claim = goal({"s1": EQUIVALENT, "s2": LOWER, "big": LOWER})
    assert claim.verdict == "reached by s1, s2" and claim.ours.startswith("s1: 3000x fewer bytes, s1 - ref = 0.1")
    assert goal({"s1": HIGHER, "s2": HIGHER, "big": LOWER}).verdict == "not reached"
    assert goal({"s1": HIGHER, "s2": INCONCLUSIVE, "big": LOWER}).verdict == INCONCLUSIVE


def test_not_testable_says_why_and_parts_combine(tmp_path):
    s = stored(tmp_path, [{"label": "a", "tokens": 4096 * 256, "steps": 256, "world_size": 4, "parameters": 1.2e6,
                           "share": 0.9}, {"label": "b"}], [comparison("a", "b", EQUIVALENT)])
    claim = judged(s, rule="not_testable", reason="65k in the paper", scale_of="a")
    assert claim.verdict == NOT_TESTABLE
    assert claim.ours == "not at this scale: 1024 tokens per worker-step and 1.2M parameters here, 65k in the paper"
    assert judged(s, rule="not_testable", reason="no such regime").ours == "not at this scale: no such regime"
    parts = [{"rule": "stays_below", "row": "a", "column": "share", "below": 0.999},
             {"rule": "no_worse", "pairs": [["a", "b"]]}]
    claim = judged(s, parts=parts)
    assert claim.verdict == REPRODUCED
    assert claim.ours == "a share 0.9; a - b = 0.1 [0.05, 0.15] nats (n = 3 paired seeds)"
    parts[0]["below"] = 0.5
    assert judged(s, parts=parts).verdict == NOT_REPRODUCED


def test_shows_add_numbers_and_what_is_not_stored_leaves_a_claim_pending(tmp_path):
    rows = [{"label": "a", "ppl": 65.4, "loss": 4.2, "method": "m"}, {"label": "b", "ppl": 45.43, "loss": 3.9,
                                                                       "method": "m"}]
    s = stored(tmp_path, rows, [comparison("a", "b", HIGHER)], preset="other")
    show = [{"gap": "ppl", "rows": ["a", "b"], "text": "ppl"}, {"lowest": "loss", "method": "m"},
            {"compare": ["a", "b"], "text": "against b"}]
    claim = judged(s, rule="higher", pairs=[["a", "b"]], show=show)
    assert claim.ours.endswith("; ppl 65.4 vs 45.43 (44 %); lowest: b (loss 3.9); against b: a - b = 0.1 [0.05, 0.15] "
                               "nats (n = 3 paired seeds)")
    for missing in ({"rule": "higher", "pairs": [["a", "c"]]}, {"rule": "ratio_about", "row": "a", "column": "gone",
                                                                "factor": 1, "band": 0.3}):
        claim = judged(s, **missing)
        assert claim.verdict == PENDING and claim.ours == "not stored yet: `make x PRESET=other OUT=results`"
        assert claim.setting == ""


@pytest.mark.parametrize("ours, claimed, verdict", [(26.7, 25, REPRODUCED), (6.8, 10, NOT_REPRODUCED),
                                                    (12.5, 10, REPRODUCED), (float("nan"), 8, PENDING)])
def test_about_n_x_is_within_the_band(ours, claimed, verdict):
    assert j.about(ours, claimed, 0.3) == verdict


def test_combined_verdict_is_the_weakest_part():
    assert j.combine([REPRODUCED, REPRODUCED]) == REPRODUCED
    assert j.combine([REPRODUCED, INCONCLUSIVE]) == INCONCLUSIVE
    assert j.combine([EQUIVALENT, INCONCLUSIVE]) == INCONCLUSIVE
    assert j.combine([INCONCLUSIVE, NOT_REPRODUCED]) == NOT_REPRODUCED


# ------------------------------------------------------------------------------------------ parsing

def entry(**fields) -> dict:
    return {"paper": "p", "source": {"paper": "P", "table": "T"}, **fields}


@pytest.mark.parametrize("entries, message", [
    ([entry(rule="lower", pairs=[]), entry(rule="lowr")], "x.yaml: claims[1].rule 'lowr' is not a rule; rules: ["),
    ([entry(rule="ratio_about", row="a", column="c", factor=25)], "x.yaml: claims[0]: rule ratio_about needs "
                                                                   "parameter(s) ['band']"),
    ([entry(rule="lower", pairs=[], colum="c")], "x.yaml: claims[0]: ['colum'] not parameter(s) of rule lower; its "
                                                  "parameters: ["),
    ([entry(parts=[{"rule": "lower", "pairs": []}, {"rule": "at_least", "row": "a"}])],
     "x.yaml: claims[0].parts[1]: rule at_least needs parameter(s) ['column', 'least']"),
    ([entry(parts=[{"rule": "lower", "pairs": []}], pairs=[])], "x.yaml: claims[0] has unknown key(s) ['pairs']"),
    ([entry(rule="lower", pairs=[], show=[{"values": "c"}])], "x.yaml: claims[0].show[0]: show values needs "
                                                               "parameter(s) ['text']"),
    ([entry(rule="lower", pairs=[], show=[{"texts": "c"}])], "x.yaml: claims[0].show[0] must be a mapping naming one"),
    ([{"paper": "p", "rule": "lower", "pairs": []}], "x.yaml: claims[0] lacks ['source']"),
    ([entry(rule="lower", pairs=[], parts=[])], "x.yaml: claims[0] lacks a rule"),
    ([entry(rule="lower", pairs=[], source={"table": "T"})], "x.yaml: claims[0].source must be a mapping"),
    ({"rule": "lower"}, "x.yaml: claims must be a list"),
])
def test_parse_errors_name_the_file_and_the_key(entries, message):
    with pytest.raises(ConfigError) as err:
        j.parse_claims(entries, "x.yaml")
    assert str(err.value).startswith(message), str(err.value)


def test_a_parsed_claim_holds_its_source_preset_and_parts():
    spec = j.parse_claims([entry(preset="claim", paper_number="25x", parts=[
        {"rule": "no_worse", "pairs": [["a", "b"]]}, {"rule": "at_least", "row": "a", "column": "c", "least": 10}])],
        "x.yaml")[0]
    assert spec.source == {"paper": "P", "table": "T"} and spec.preset == "claim" and spec.paper_number == "25x"
    assert [p.rule for p in spec.judged] == ["no_worse", "at_least"] and spec.rule == ""
    assert j.parse_claims([entry(rule="lower", pairs=[["a", "b"]])], "x.yaml")[0].judged[0].params == \
        {"pairs": [["a", "b"]]}


def test_every_experiment_config_parses_with_its_claims():
    with_claims = [spec.name for spec in experiments(ROOT / "experiments") if spec.claims]
    assert {"table3_main", "communication", "compressed_sync"} <= set(with_claims)


def code_strings(source: str) -> list[tuple[int, str]]:
    """(line, text) of every string literal of a module that is not a docstring."""
    tree = ast.parse(source)
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs]


# an experiment named by a word the code also uses in its own sense (the length of an lr schedule, a column)
ORDINARY_WORDS = {"horizon"}


def test_no_repro_module_names_an_experiment_or_a_row():
    """No string in the code of lowcomm.repro (docstrings aside) is an experiment's name or a run label, or names
    one as a word: what an experiment runs, tables, draws and claims is its config's."""
    specs = experiments(ROOT / "experiments")
    words = ({spec.name for spec in specs} | {run.label for spec in specs for run in spec.runs}) - ORDINARY_WORDS
    words -= set(OPTIMIZER_FAMILIES)  # an optimizer family's name (the cost model's, a benchmark's key) names no row
    for path in sorted((ROOT / "src" / "lowcomm" / "repro").glob("*.py")):
        named = sorted({(line, w) for line, text in code_strings(path.read_text()) for w in words
                        if re.search(rf"(?<![\w.]){re.escape(w)}(?!\w)", text)})
        assert not named, f"{path.name} names {named}"
