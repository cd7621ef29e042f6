"""Stored files that cannot be read (lowcomm.stored): each reader names the file, what is wrong and the fix in one
line; commands that aggregate skip an unreadable run and say so; every command line answers --help."""

from __future__ import annotations

import importlib
import shutil
from pathlib import Path

import pandas as pd
import pytest

from lowcomm.repro import experiment, judge, report
from lowcomm.repro.store import ResultsStore, read_run_files
from lowcomm.stored import StoredFileError, counting_skipped, skip

ROOT = Path(__file__).resolve().parents[2]
PRESET = Path("spectral_local_steps") / "probe_paired"  # the smallest stored preset: 6 runs
COMMANDS = sorted(".".join(p.relative_to(ROOT / "src").with_suffix("").parts)
                  for p in (ROOT / "src" / "lowcomm").rglob("*.py") if 'if __name__ == "__main__":' in p.read_text())


@pytest.fixture
def results(tmp_path) -> Path:
    """A copy of the stored preset under <tmp>/results/, in the layout of results/."""
    shutil.copytree(ROOT / "results" / PRESET, tmp_path / "results" / PRESET)
    return tmp_path / "results"


def cut_short(path: Path) -> None:
    """Truncate a file in the middle of its last line."""
    path.write_text(path.read_text()[:-5])


def assert_names(err: pytest.ExceptionInfo, path: Path, problem: str) -> None:
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{path}: {problem}"), message


@pytest.mark.parametrize("name, damage, problem", [
    ("record.json", lambda p: p.write_text('{"status": "comp'), "cannot be read as JSON (Unterminated string"),
    ("config.yaml", lambda p: p.write_text("optim: {name: [adamw\n"), "cannot be read as YAML"),
    ("metrics.csv", cut_short, "cut short"),
    ("metrics.csv", lambda p: p.unlink(), "missing"),
])
def test_a_run_file_that_cannot_be_read_is_named_with_the_fix(results, name, damage, problem):
    run_dir = results / PRESET / "runs" / "muloco-s1"
    damage(run_dir / name)
    with pytest.raises(StoredFileError, match="train the run again") as err:
        read_run_files(run_dir)
    assert_names(err, run_dir / name, problem)


def test_a_table_cut_short_names_the_command_that_rebuilds_it(results):
    cut_short(results / PRESET / "table.csv")
    with pytest.raises(StoredFileError, match=f"experiments/spectral_local_steps/config.yaml probe_paired --out "
                                              f"{results} --tables-only") as err:
        ResultsStore(results).preset(*PRESET.parts).table()
    assert_names(err, results / PRESET / "table.csv", "cut short")
    with pytest.raises(StoredFileError):
        judge.Stored(ResultsStore(results).preset(*PRESET.parts))  # the report stops on it


def test_a_model_file_that_cannot_be_read_is_named(tmp_path):
    from lowcomm.eval.evaluate import load_run

    (tmp_path / "config.yaml").write_text("data: {corpus: offline}\n")
    (tmp_path / "model.pt").write_bytes(b"not a model" * 20)
    with pytest.raises(StoredFileError, match="train the run again") as err:
        load_run(tmp_path)
    assert_names(err, tmp_path / "model.pt", "cannot be read as a model file")


def test_tables_only_skips_a_run_it_cannot_read_says_so_and_tables_the_others(results, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    record = results / PRESET / "runs" / "muloco-s2" / "record.json"
    record.write_text('{"status": "comp')
    experiment.main(["experiments/spectral_local_steps/config.yaml", "probe_paired", "--out", str(results),
                     "--tables-only"])
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"1 stored file could not be read (skipped): {record}: cannot be "
                                               "read as JSON"), err
    table = pd.read_csv(results / PRESET / "table.csv").set_index("label")
    assert table.loc["muloco", "runs"] == "muloco-s1 muloco-s3" and table.loc["diloco", "seeds"] == 3


def test_the_report_skips_a_main_job_record_it_cannot_read(tmp_path):
    for name, parameters in (("ddp-s0-1", 1e6), ("ddp-s0-2", 2e6)):
        (tmp_path / "train" / name).mkdir(parents=True)
        (tmp_path / "train" / name / "record.json").write_text(
            f'{{"parameters": {parameters}, "world_size": 4, "steps": 8, "initial_val_ppl": 9, "final_val_ppl": 8, '
            '"tokens_per_s": 1000, "wall_time_s": 60, "git_commit": "abc"}')
    (tmp_path / "train" / "ddp-s0-2" / "record.json").write_text("")
    assert "ddp-s0-1): 1M parameters" in report.main_job_section(ResultsStore(tmp_path))


def test_the_skipped_line_counts_the_files_and_names_the_first_three(capsys):
    with counting_skipped():
        pass
    assert capsys.readouterr().err == ""  # nothing skipped: no line
    with counting_skipped():
        for i in range(5):
            skip(StoredFileError(f"r/a-s{i}/record.json", "missing", "train the run again"))
        skip(StoredFileError("r/a-s0/record.json", "missing", "train the run again"))  # one path counts once
    assert capsys.readouterr().err == (
        "5 stored files could not be read (skipped): r/a-s0/record.json: missing; r/a-s1/record.json: missing; "
        "r/a-s2/record.json: missing; 2 more (train the run again)\n")


@pytest.mark.parametrize("module", COMMANDS)
def test_every_command_line_answers_help(module, capsys):
    try:
        importlib.import_module(module).main(["--help"])
    except SystemExit as done:
        assert done.code in (0, None)
    assert capsys.readouterr().out.strip()  # the usage, or the module's docstring


def test_no_stored_run_file_names_an_absolute_path_of_the_machine_it_ran_on():
    """Run records and configs under results/ name paths relative to the repository (run.out_dir, lowcomm_location)."""
    absolute = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "results").rglob("*"))
                if p.name in ("record.json", "config.yaml") and ('": "/' in (text := p.read_text()) or ": /" in text)]
    assert absolute == [], f"{len(absolute)} stored files name an absolute path, e.g. {absolute[:3]}"
