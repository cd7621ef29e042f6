"""The emulated-network launcher: it refuses without root before creating anything; its namespaces, bridge and
caps stay on their own addresses, the measured rate of a link is its cap, and everything is gone after a run,
after Ctrl-C and after a worker fails. Skipped, with the reason, where the machine cannot emulate a network."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support import SMOKE

from lowcomm.config import ConfigError, load_config, run_config
from lowcomm.training import emulated_network
from lowcomm.training.emulated_network import (
    Cluster,
    launch,
    measure_link,
    missing_requirements,
)

REASON = missing_requirements()
needs_network = pytest.mark.skipif(REASON is not None, reason=str(REASON))
NODES = [o for o in SMOKE if not o.startswith("train.devices=")] + ["train.devices=1", "train.num_nodes=2"]


def network_state() -> tuple[str, str, str]:
    """What a launch must leave as it found it: namespaces, links, the host's addresses and routes."""
    return tuple(subprocess.run(c, capture_output=True, text=True).stdout for c in
                 (["ip", "netns", "list"], ["ip", "-o", "link"], ["ip", "-o", "addr"]))


def test_without_root_it_refuses_in_one_line_before_creating_anything(tmp_path, monkeypatch):
    monkeypatch.setattr(emulated_network.os, "geteuid", lambda: 1000)
    before = network_state() if REASON is None else None
    cfg = run_config(load_config(None, NODES + ["train.link_rate_mbit=50", f"run.out_dir={tmp_path}", "run.name=r"]))
    with pytest.raises(ConfigError, match="needs root"):
        launch(cfg)
    assert not (tmp_path / "r").exists() and (before is None or network_state() == before)


def test_one_worker_per_node_is_required(tmp_path):
    cfg = run_config(load_config(None, NODES + ["train.num_nodes=1", "train.link_rate_mbit=50",
                                                f"run.out_dir={tmp_path}", "run.name=r"]))
    with pytest.raises(ConfigError, match="train.num_nodes >= 2"):
        launch(cfg)


@needs_network
def test_links_are_capped_and_stay_on_their_own_bridge_and_nothing_is_left():
    before = network_state()
    cluster = Cluster(workers=2, rate_mbit=40)
    try:
        cluster.create()
        host_addresses = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True).stdout
        assert str(cluster.subnet.network_address)[:-1] not in host_addresses  # the bridge has no address
        for i in range(2):
            inside = emulated_network.run("ip", "-4", "route", netns=cluster.namespace(i)).stdout
            assert "default" not in inside and str(cluster.subnet) in inside  # no route out of the namespace
        rate = measure_link(cluster, 0)
        assert 0.85 * 40 < rate < 1.05 * 40
    finally:
        cluster.remove()
    assert network_state() == before


def launcher(tmp_path, name: str, *overrides: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "lowcomm.training.emulated_network", "--workers", "2",
                             "--rate-mbit", "40", "--name", name, "--", *SMOKE, f"run.out_dir={tmp_path}", *overrides],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


@pytest.mark.slow
@needs_network
def test_a_run_completes_with_the_measured_rates_in_its_record_and_ctrl_c_removes_everything(tmp_path):
    before = network_state()
    done = launcher(tmp_path, "complete", "train.steps=10", "train.val_every=10")
    output = done.communicate(timeout=300)[0]
    assert done.returncode == 0, output[-3000:]
    record = json.loads((tmp_path / "complete" / "record.json").read_text())
    assert record["status"] == "complete" and record["world_size"] == 2 and record["replicas_identical"] is True
    assert len(record["link_rate_measured_mbit"]) == 2 and min(record["link_rate_measured_mbit"]) > 0.85 * 40
    assert network_state() == before

    stopped = launcher(tmp_path, "stopped", "train.steps=3000", "train.val_every=1000")
    for line in stopped.stdout:
        if line.startswith("step "):  # training is under way
            break
    os.kill(stopped.pid, signal.SIGINT)
    output = stopped.communicate(timeout=300)[0]
    assert stopped.returncode == 128 + signal.SIGINT, output[-3000:]
    assert json.loads((tmp_path / "stopped" / "record.json").read_text())["status"] == "interrupted"
    assert network_state() == before


def emulated_worker(rank: int) -> int:
    """The pid of the training worker of `rank` inside the emulated network (from /proc: its environment)."""
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if (b"LOWCOMM_EMULATED_NETWORK=1" in environ and f"RANK={rank}".encode() in environ
                and b"lowcomm.training.train" in cmdline and b"torch.distributed.run" not in cmdline):
            return int(proc.name)
    raise LookupError(f"no emulated worker of rank {rank}")


@pytest.mark.slow
@needs_network
def test_a_worker_that_dies_ends_the_run_and_everything_is_removed(tmp_path):
    before = network_state()
    failing = launcher(tmp_path, "failing", "train.steps=3000", "train.val_every=1000", "train.collective_timeout_s=20")
    for line in failing.stdout:
        if line.startswith("step "):
            break
    os.kill(emulated_worker(1), signal.SIGKILL)
    output = failing.communicate(timeout=300)[0]
    assert failing.returncode not in (0, None) and "emulated-network run ended with status" in output, output[-3000:]
    assert network_state() == before
