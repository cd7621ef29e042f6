"""Faults after start-up, on real gloo workers (forked from the run's fork server): signals, a killed worker, a
diverging loss."""

import csv
import errno
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import SMOKE

from lowcomm.config import load_config
from lowcomm.training.command import RunEnded
from lowcomm.training.lightning.launcher import write_line
from lowcomm.training.train import main, train
from lowcomm.training.validation import validate

pytestmark = pytest.mark.slow  # trains with several worker processes


def strict_json(path: Path) -> dict:
    """The JSON file, refusing the non-standard constants NaN and Infinity."""
    def refuse(name):
        raise ValueError(f"{path} holds {name}, which is not JSON")

    return json.loads(path.read_text(), parse_constant=refuse)


def losses(run_dir: Path) -> dict[int, float]:
    with open(run_dir / "metrics.csv") as f:
        return {int(r["step"]): float(r["loss"]) for r in csv.DictReader(f) if r["loss"]}


def descendants(pid: int) -> list[int]:
    """Live (not zombie) processes under `pid`, from /proc."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = [], [pid]
    while frontier:
        children = [p for p, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def workers_by_rank(pid: int) -> list[int]:
    """The workers of the training process `pid` (children of its fork server), in start order (= rank order)."""
    def stat(p):
        return Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()

    servers = {p for p in descendants(pid) if int(stat(p)[1]) == pid
               and b"forkserver" in Path(f"/proc/{p}/cmdline").read_bytes()}
    workers = [p for p in descendants(pid) if int(stat(p)[1]) in servers]
    return sorted(workers, key=lambda p: int(stat(p)[19]))


def start_run(out_dir: Path, *overrides: str) -> subprocess.Popen:
    """`python -m lowcomm.training.train` on the smoke config in its own session (a process group, as in a terminal)."""
    args = [sys.executable, "-m", "lowcomm.training.train", *SMOKE, f"run.out_dir={out_dir}", "run.name=run", *overrides]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def wait_until(condition, proc: subprocess.Popen, timeout: float = 180) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"the run ended early:\n{proc.communicate()[1][-3000:]}"
        assert time.monotonic() < end, "the run did not get there in time"
        time.sleep(0.05)


def checkpoint_done(run_dir: Path, step: int) -> bool:
    return all((run_dir / "checkpoints" / f"step{step:06d}.rank{r}.ckpt").exists() for r in range(2))


def logged_step(run_dir: Path) -> int:
    try:
        return max(losses(run_dir), default=0)
    except (OSError, ValueError, KeyError):
        return 0


def assert_no_process_left(pids: list[int]) -> None:
    end = time.monotonic() + 10
    while any(Path(f"/proc/{p}").exists() and Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
              for p in pids):
        assert time.monotonic() < end, f"processes outlived the run: {pids}"
        time.sleep(0.1)


@pytest.mark.parametrize("signum, stuck", [(signal.SIGINT, False), (signal.SIGTERM, True)],
                         ids=["SIGINT: the workers stop at a step boundary",
                              "SIGTERM to a stuck run: the workers are killed after collective_timeout_s"])
def test_a_signal_to_the_parent_ends_every_worker_and_records_an_interrupted_run(tmp_path, signum, stuck):
    proc = start_run(tmp_path, "train.steps=2000", "run.checkpoint_every=8", "train.collective_timeout_s=10")
    run_dir = tmp_path / "run"
    try:
        wait_until(lambda: checkpoint_done(run_dir, 8), proc)
        processes = descendants(proc.pid)
        if stuck:
            for worker in workers_by_rank(proc.pid):
                os.kill(worker, signal.SIGSTOP)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=90)
    finally:
        proc.kill()
    name = signal.Signals(signum).name
    assert proc.returncode == 128 + signum, err[-3000:]
    assert err.strip().splitlines()[-1].startswith(f"error: interrupted by {name}")
    assert_no_process_left(processes)  # the workers and multiprocessing's resource tracker
    record = strict_json(run_dir / "record.json")
    assert record["status"] == "interrupted" and record["signal"] == name
    assert not (run_dir / "model.pt").exists()
    if not stuck:
        assert 8 <= record["stopped_at_step"] < 2000
    checkpoint = Path(record["last_checkpoint"])
    assert checkpoint.parent == run_dir / "checkpoints" and checkpoint.name.startswith("step")
    validate(load_config(None, SMOKE + ["train.steps=2000", f"run.resume_from={checkpoint}"]))  # whole, compatible


def test_a_killed_worker_ends_the_run_and_its_checkpoint_resumes_it_exactly(tmp_path):
    common = ["train.steps=64", "run.checkpoint_every=16", "train.collective_timeout_s=20"]
    proc = start_run(tmp_path, *common)
    killed_dir = tmp_path / "run"
    try:
        wait_until(lambda: checkpoint_done(killed_dir, 32) and logged_step(killed_dir) >= 36, proc)
        processes = descendants(proc.pid)
        rank1 = workers_by_rank(proc.pid)[1]
        killed_at = time.monotonic()
        os.kill(rank1, signal.SIGKILL)
        _, err = proc.communicate(timeout=90)
        detected_s = time.monotonic() - killed_at
    finally:
        proc.kill()
    record = strict_json(killed_dir / "record.json")
    message = err.strip().splitlines()[-1]
    assert proc.returncode == 1, err[-3000:]
    assert message.startswith("error: worker rank 1 was killed by SIGKILL") and record["last_checkpoint"] in message
    assert "out of memory" in message and "leaked semaphore" not in err and "Warning" not in err, err[-3000:]
    assert record["status"] == "failed"
    assert_no_process_left(processes)

    checkpoint = record["last_checkpoint"]
    resumed = train(load_config(None, SMOKE + common + [f"run.out_dir={tmp_path}", "run.name=resumed",
                                                        f"run.resume_from={checkpoint}"]))
    before, after = losses(killed_dir), losses(resumed)
    start = int(Path(checkpoint).stem[4:])
    overlap = [s for s in after if s in before and s > start]
    assert overlap, (start, sorted(before))
    for step in overlap:  # the killed run was uninterrupted up to the kill
        assert after[step] == pytest.approx(before[step], abs=1e-6)
    print(f"detected in {detected_s:.1f}s; steps lost {max(before) - start}; resumed to step {max(after)}")


def test_a_workers_last_line_goes_out_in_one_write(monkeypatch):
    """A worker killed between the text and the newline of its message would leave the parent's error on its line."""
    writes = []
    monkeypatch.setattr(os, "write", lambda fd, data: writes.append((fd, data)) or len(data))
    write_line("rank 0: a collective failed: Connection reset by peer")
    assert writes == [(2, b"rank 0: a collective failed: Connection reset by peer\n")]


def test_a_nonfinite_loss_stops_the_run_with_a_diverged_record(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(SMOKE + ["optim.lr=1e6", f"run.out_dir={tmp_path}", "run.name=run"])
    assert exit_.value.code == 1
    record = strict_json(tmp_path / "run" / "record.json")
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert record["status"] == "diverged" and record["stopped_at_step"] < 30
    assert f"not finite at step {record['stopped_at_step']}" in message and "lower optim.lr" in message
    assert not (tmp_path / "run" / "model.pt").exists()


def test_a_full_disk_ends_the_run_in_one_line_and_its_last_checkpoint_resumes_it(tmp_path, monkeypatch):
    """The checkpoint of step 8 runs out of space halfway (ENOSPC, injected): its temporary file goes, every rank stops
    at the next step boundary, the record says failed and why, and the checkpoint of step 4 resumes the run."""
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

    write = TorchCheckpointIO.save_checkpoint

    def full_at_step_8(self, checkpoint, path, storage_options=None):
        if "step000008" in str(path):
            Path(path).write_bytes(b"half a checkpoint")
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return write(self, checkpoint, path, storage_options)

    monkeypatch.setattr(TorchCheckpointIO, "save_checkpoint", full_at_step_8)
    common = SMOKE + ["train.devices=1", "train.steps=16", "train.val_every=8", "train.log_every=4",
                      "run.checkpoint_every=4", f"run.out_dir={tmp_path}"]
    with pytest.raises(RunEnded) as ended:
        train(load_config(None, common + ["run.name=full"]))
    run = tmp_path / "full"
    assert ended.value.exit_code == 1
    assert re.fullmatch(rf"rank 0 could not write: no space left on device writing {run}/checkpoints/step000008.rank0.ckpt "
                        rf"\([\d,]+ bytes needed\); the run stopped after step 9 \(free space, then last checkpoint "
                        rf"{run}/checkpoints/step000004.ckpt .*\); record {run}/record.json", str(ended.value))
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step000004.rank0.ckpt"]
    record = strict_json(run / "record.json")
    assert record["status"] == "failed" and "step000008.rank0.ckpt" in record["failure"]
    assert not (run / "model.pt").exists()
    monkeypatch.setattr(TorchCheckpointIO, "save_checkpoint", write)  # space is back
    resumed = train(load_config(None, common + ["run.name=resumed", f"run.resume_from={record['last_checkpoint']}"]))
    assert strict_json(resumed / "record.json")["status"] == "complete"
    assert losses(resumed)[8] == pytest.approx(losses(run)[8], abs=1e-6)
