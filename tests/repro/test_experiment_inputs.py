"""The experiment runner's command line (`python -m lowcomm.repro.experiment`): its usage, and inputs it refuses in
one line before any run starts, leaving nothing in the output directory."""

from pathlib import Path

import pytest
from support import error_line

from lowcomm.repro import experiment

ROOT = Path(__file__).resolve().parents[2]
TABLE3 = ROOT / "experiments" / "table3_main" / "config.yaml"


def test_experiment_help_prints_the_usage(capsys):
    with pytest.raises(SystemExit) as exit_:
        experiment.main(["--help"])
    assert exit_.value.code == 0
    assert "python -m lowcomm.repro.experiment" in capsys.readouterr().out


@pytest.mark.parametrize("argv, words", [
    (["--seeds", ","], "preset smoke has no seeds"),
    (["--labels", "ddp, muon"], "preset smoke has no run labels ['muon']: its labels are ['ddp', 'lordo']"),
    (["--labels", ","], "--labels ',': give comma-separated run labels"),
    (["--out", "{out}", "train.warmup=100"], "train.warmup=100"),  # overrides after --out, as the usage line shows
])
def test_experiment_command_line(argv, words, tmp_path):
    argv = [a.format(out=tmp_path) for a in argv]
    message = error_line(experiment.main, [str(TABLE3), "smoke", *argv])
    assert words in message, message
    assert list(tmp_path.iterdir()) == []


def test_two_runs_of_one_label_are_refused(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(TABLE3.read_text().replace(
        "  - {label: lordo, overrides: [method=lordo]}",
        "  - {label: lordo, overrides: [method=lordo]}\n  - {label: lordo, overrides: [method=lordo_local]}"))
    message = error_line(experiment.main, [str(config), "smoke", "--out", str(tmp_path / "out")])
    assert "['lordo'] more than once" in message and not (tmp_path / "out").exists()
