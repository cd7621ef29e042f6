"""Run directories and records: one run per directory, record.json written last, atomically, as strict JSON."""

import errno
import json
import platform
import subprocess
from importlib.metadata import version
from pathlib import Path

import pytest

from lowcomm.config import ConfigError, load_config, run_config
from lowcomm.training import run_dir as results
from lowcomm.training.run_dir import (
    NoSpace,
    RunDirectory,
    checkpoint_path,
    completed_record,
    last_checkpoint,
    rank_checkpoint_file,
)


def test_a_directory_holding_another_run_is_refused_unless_overwrite(tmp_path):
    cfg = run_config(load_config(None, [f"run.out_dir={tmp_path}"]))
    old = RunDirectory(tmp_path / "run")
    old.create(cfg)
    old.write_record({"status": "complete"})
    (old.path / "model.pt").write_text("old weights")
    with pytest.raises(ConfigError, match="already holds a run .*status complete.*run.name.*run.overwrite=true"):
        RunDirectory(tmp_path / "run").create(cfg)
    assert (old.path / "model.pt").exists()
    RunDirectory(tmp_path / "run").create(cfg, overwrite=True)
    assert sorted(p.name for p in old.path.iterdir()) == ["config.yaml"]


def test_an_out_dir_that_cannot_be_written_is_named(tmp_path):
    (tmp_path / "a_file").write_text("")
    cfg = run_config(load_config(None, [f"run.out_dir={tmp_path / 'a_file'}"]))
    with pytest.raises(ConfigError, match="run.out_dir=.*a_file.*cannot write"):
        RunDirectory(tmp_path / "a_file" / "run").create(cfg)


def test_record_is_strict_json_with_nonfinite_numbers_as_null(tmp_path):
    run = RunDirectory(tmp_path)
    run.write_record({"status": "diverged", "loss": float("nan"), "ppl": float("inf"), "history": [1.0, float("-inf")]})
    text = (tmp_path / "record.json").read_text()
    record = json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in record.json"))
    assert record["loss"] is None and record["ppl"] is None and record["history"] == [1.0, None]
    with pytest.raises(ValueError, match="status"):
        run.write_record({"final_val_loss": 1.0})


def test_record_is_replaced_whole_or_not_at_all(tmp_path, monkeypatch):
    """A record that does not fit leaves the previous one, no temporary file, and NoSpace naming path and bytes."""
    run = RunDirectory(tmp_path)
    run.write_record({"status": "interrupted", "steps": 8})

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(results.os, "fsync", full)
    with pytest.raises(NoSpace, match=rf"^no space left on device writing {tmp_path}/record.json \([\d,]+ bytes needed\)$"):
        run.write_record({"status": "complete", "steps": 16})
    assert json.loads((tmp_path / "record.json").read_text()) == {"status": "interrupted", "steps": 8,
                                                                  "wall_time_s": pytest.approx(0, abs=60)}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["record.json"]


def test_a_metrics_row_that_does_not_fit_is_taken_back(tmp_path, monkeypatch):
    run = RunDirectory(tmp_path)
    run.log({"step": 0, "val_loss": 8.0})
    run.log({"step": 8, "val_loss": 7.0})
    real_open = open

    class HalfWrite:  # the file of `open`, whose writes stop halfway for lack of space
        def __init__(self, *args, **kwargs):
            self.f = real_open(*args, **kwargs)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, text):
            self.f.write(text[: len(text) // 2])
            self.f.flush()
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.f, name)

    monkeypatch.setattr(results, "open", HalfWrite, raising=False)
    with pytest.raises(NoSpace, match="metrics.csv"):
        run.log({"step": 16, "val_loss": 6.0})
    assert (tmp_path / "metrics.csv").read_text().splitlines() == ["step,val_loss", "0,8.0", "8,7.0"]


def test_only_a_complete_record_counts_as_a_finished_run(tmp_path):
    assert completed_record(tmp_path) is None
    (tmp_path / "record.json").write_text('{"status": "comp')
    assert completed_record(tmp_path) is None
    for status in ("interrupted", "diverged", "failed"):
        RunDirectory(tmp_path).write_record({"status": status})
        assert completed_record(tmp_path) is None
    RunDirectory(tmp_path).write_record({"status": "complete", "final_val_loss": 3.0})
    assert completed_record(tmp_path)["final_val_loss"] == 3.0


def test_last_checkpoint_is_the_latest_with_every_rank(tmp_path):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    assert last_checkpoint(tmp_path, 2) is None
    for name in ("step000008.rank0.ckpt", "step000008.rank1.ckpt", "step000016.rank0.ckpt", ".step000016.rank1.ckpt.tmp"):
        (folder / name).write_text("")
    assert last_checkpoint(tmp_path, 2) == folder / "step000008.ckpt"
    assert last_checkpoint(tmp_path, 1) == folder / "step000016.ckpt"


def test_checkpoint_names():
    assert checkpoint_path("runs/a", 8) == Path("runs/a/checkpoints/step000008.ckpt")
    assert rank_checkpoint_file(checkpoint_path("runs/a", 1234567), 3) == Path(
        "runs/a/checkpoints/step1234567.rank3.ckpt")


def test_a_record_names_the_changed_files_of_a_dirty_commit(tmp_path):
    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("a = 1\n")
    (tmp_path / "notes.md").write_text("outside src/ and experiments/\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "first")
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    (tmp_path / "notes.md").write_text("edited\n")
    assert (results.git_commit(tmp_path), results.git_changes(tmp_path)) == (sha, [])
    (tmp_path / "src" / "a.py").write_text("a = 2\n")
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "new.yaml").write_text("name: new\n")
    assert results.git_commit(tmp_path) == sha + "-dirty"
    assert results.git_changes(tmp_path) == ["experiments/new.yaml", "src/a.py"]
    assert results.git_commit(tmp_path / "notes.md") == "unknown"


def test_a_package_imported_from_its_checkout_records_the_checkout_and_its_commit():
    root = Path(__file__).resolve().parents[2]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()
    source = results.code_source()
    assert results.checkout() == root
    assert source["lowcomm_version"] == version("lowcomm")
    assert source["lowcomm_location"] == "src/lowcomm"  # relative: a stored record names no machine's path
    assert source["git_commit"].removesuffix("-dirty") == head


def test_a_cpu_record_names_the_cpu_model_from_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8481C\n"
                       "processor\t: 1\nmodel name\t: Intel(R) Xeon(R) Platinum 8481C\n")
    assert results.cpu_model(cpuinfo) == "Intel(R) Xeon(R) Platinum 8481C"
    assert results.cpu_model(tmp_path / "absent") == (platform.processor() or platform.machine())
    assert results.environment("cpu")["device"] == results.cpu_model()
