"""An emulated cluster on one machine: one network namespace per worker, joined by veth pairs to a bridge, every
link capped by a token bucket (tc tbf) in both directions, and one torchrun agent per namespace (gloo over TCP).

    python -m lowcomm.training.emulated_network --workers 4 --rate-mbit 100 [--name NAME] -- CONFIG key=value ...

or, from a config, `train.link_rate_mbit=100 train.num_nodes=4 train.devices=1` (lowcomm.training.train starts
the cluster itself). Needs root, `ip` and `tc`; without them it refuses in one line before creating anything.

What it creates (names carry a per-launch tag): a bridge without an address on the host, M namespaces each with
`lo` and one veth end `eth0` holding 10.R.T.(i+1)/24 and no default route, so traffic stays on the bridge; nothing
else on the machine changes. Before training it measures each link's rate with a bulk TCP transfer from worker i's
namespace to worker i+1's (both links capped, so the slower of the two is measured). Everything it created is
removed on exit, on Ctrl-C / SIGTERM and when a worker fails.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from lowcomm.config import ConfigError, RunConfig, load_config, run_config
from lowcomm.training.command import INSIDE_EMULATED_NETWORK, RunEnded, run_command
from lowcomm.training.validation import check_config

PROBE_SECONDS = 2.0  # each link's bulk transfer lasts about this long at its cap
RENDEZVOUS_PORT = 29500


def bucket_bytes(rate_mbit: float) -> int:
    """tbf's bucket: 10 ms at the rate, at least 64 KiB so that one segmentation-offloaded packet fits."""
    return max(int(rate_mbit * 1e6 / 8 * 0.01), 64 * 1024)


def missing_requirements() -> str | None:
    """Why this machine cannot emulate a cluster (one line), or None: root, `ip` and `tc`, and a kernel that gives
    a namespace a veth pair with a tbf qdisc (tried on a namespace that is removed again)."""
    if os.geteuid() != 0:
        return "the emulated network needs root (network namespaces and tc): run as root or drop train.link_rate_mbit"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"the emulated network needs `{tool}` (iproute2) on PATH: install iproute2"
    probe = f"lcprobe{os.getpid() % 100000}"
    try:
        run("ip", "netns", "add", probe)
        run("ip", "link", "add", "probe0", "type", "veth", "peer", "name", "probe1", netns=probe)
        run("tc", "qdisc", "add", "dev", "probe0", "root", "tbf", "rate", "1mbit", "burst", "64k", "latency", "200ms",
            netns=probe)
    except RuntimeError as err:
        return f"this kernel cannot emulate the network (network namespaces, veth, tc tbf): {err}"
    finally:
        run("ip", "netns", "delete", probe, check=False)
    return None


def run(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    command = (["ip", "netns", "exec", netns] if netns else []) + list(args)
    done = subprocess.run(command, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"`{' '.join(command)}` failed: {done.stderr.strip()}")
    return done


def free_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.0.0.0/8 that no address or route of this machine overlaps."""
    used = [ipaddress.ip_network(word, strict=False)
            for line in run("ip", "-4", "-o", "addr").stdout.splitlines() + run("ip", "-4", "route").stdout.splitlines()
            for word in line.split() if "/" in word and word[0].isdigit()]
    for second in range(200, 256):
        for third in range(256):
            net = ipaddress.ip_network(f"10.{second}.{third}.0/24")
            if not any(net.overlaps(u) for u in used):
                return net
    raise RuntimeError("no free /24 in 10.200.0.0-10.255.255.0 for the emulated network")


@dataclass
class Cluster:
    """The namespaces, links and caps of one launch; `remove` undoes all of it (idempotent)."""

    workers: int
    rate_mbit: float
    tag: str = field(default_factory=lambda: f"lc{os.getpid() % 100000}")
    subnet: ipaddress.IPv4Network | None = None
    created: list[tuple[str, str]] = field(default_factory=list)  # ("netns" | "link", name), in creation order

    @property
    def bridge(self) -> str:
        return f"{self.tag}br"

    def namespace(self, i: int) -> str:
        return f"{self.tag}w{i}"

    def address(self, i: int) -> str:
        return str(self.subnet.network_address + i + 1)

    def create(self) -> None:
        self.subnet = free_subnet()
        rate, burst = f"{self.rate_mbit}mbit", str(bucket_bytes(self.rate_mbit))
        run("ip", "link", "add", self.bridge, "type", "bridge")
        self.created.append(("link", self.bridge))
        run("ip", "link", "set", self.bridge, "up")
        for i in range(self.workers):
            ns, host_end = self.namespace(i), f"{self.tag}v{i}"
            run("ip", "netns", "add", ns)
            self.created.append(("netns", ns))
            run("ip", "link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", ns)
            self.created.append(("link", host_end))
            run("ip", "link", "set", host_end, "master", self.bridge, "up")
            run("ip", "addr", "add", f"{self.address(i)}/{self.subnet.prefixlen}", "dev", "eth0", netns=ns)
            run("ip", "link", "set", "lo", "up", netns=ns)
            run("ip", "link", "set", "eth0", "up", netns=ns)
            for dev, inside in ((host_end, None), ("eth0", ns)):  # into the namespace, and out of it
                run("tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst", burst, "latency", "200ms",
                    netns=inside)

    def remove(self) -> None:
        for kind, name in reversed(self.created):
            if kind == "netns":
                run("ip", "netns", "delete", name, check=False)  # removes its veth end, and with it the pair
            else:
                run("ip", "link", "delete", name, check=False)
        self.created.clear()


PROBE_RECEIVER = """
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(1); print("ready", flush=True); c, _ = s.accept(); n, t0 = 0, None
while True:
    b = c.recv(1 << 20)
    if not b: break
    t0 = t0 or time.perf_counter(); n += len(b)
print(n, time.perf_counter() - t0, flush=True)
"""
PROBE_SENDER = """
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2]))); c.sendall(b"\\0" * int(sys.argv[3])); c.close()
"""


def measure_link(cluster: Cluster, i: int, port: int = RENDEZVOUS_PORT + 100) -> float:
    """Mbit/s of a bulk TCP transfer from worker i's namespace to worker i+1's (about PROBE_SECONDS long)."""
    j = (i + 1) % cluster.workers
    size = int(cluster.rate_mbit * 1e6 / 8 * PROBE_SECONDS)
    receiver = subprocess.Popen(["ip", "netns", "exec", cluster.namespace(j), sys.executable, "-c", PROBE_RECEIVER,
                                 cluster.address(j), str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert receiver.stdout.readline().strip() == "ready"
        run(sys.executable, "-c", PROBE_SENDER, cluster.address(j), str(port), str(size), netns=cluster.namespace(i))
        received, seconds = receiver.stdout.readline().split()
        receiver.wait(timeout=30)
    finally:
        receiver.kill()
    return int(received) * 8 / float(seconds) / 1e6


def agent_command(cluster: Cluster, i: int, config_file: Path) -> list[str]:
    """Worker i's torchrun agent inside its namespace: agent 0 hosts the rendezvous store, and each agent names its
    own address (the machine's hostname resolves to an address outside the namespaces)."""
    return ["ip", "netns", "exec", cluster.namespace(i), sys.executable, "-m", "torch.distributed.run",
            f"--nnodes={cluster.workers}", "--nproc-per-node=1", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={cluster.address(0)}:{RENDEZVOUS_PORT}", f"--rdzv-conf=is_host={int(i == 0)}",
            f"--local-addr={cluster.address(i)}", "-m", "lowcomm.training.train", str(config_file)]


def stop(agents: list[subprocess.Popen], grace_s: float) -> None:
    """SIGTERM to every running agent's process group (the run records itself as interrupted), SIGKILL to those
    still running after grace_s."""
    for agent in agents:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for agent in agents:
        try:
            agent.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait()


def run_agents(cluster: Cluster, config_file: Path, log_dir: Path, grace_s: float) -> int:
    """One torchrun agent per namespace (agent 0's output here, the others' in log_dir); the first agent to fail
    stops the rest. Returns the exit status (0, or the first non-zero one)."""
    env = {**os.environ, INSIDE_EMULATED_NETWORK: "1", "GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1"}
    agents = []
    try:
        for i in range(cluster.workers):
            log = None if i == 0 else open(log_dir / f"agent{i}.log", "w")
            agents.append(subprocess.Popen(agent_command(cluster, i, config_file), env=env, stdout=log,
                                           stderr=subprocess.STDOUT if log else None, start_new_session=True))
        while True:
            codes = [agent.poll() for agent in agents]
            failed = [c for c in codes if c not in (None, 0)]
            if failed or all(c == 0 for c in codes):
                return failed[0] if failed else 0
            time.sleep(0.2)
    finally:
        stop(agents, grace_s)


def interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def launch(cfg: RunConfig) -> Path:
    """Train `cfg` (train.num_nodes workers of one device each) on an emulated cluster whose links are capped at
    train.link_rate_mbit; the run's record gains `link_rate_measured_mbit` (one value per link). Returns the run
    directory; a run that did not complete raises RunEnded with the agents' exit status."""
    t = cfg.train
    if t.devices != 1 or t.num_nodes < 2 or t.accelerator != "cpu" or not cfg.run.name:
        raise ConfigError(f"train.link_rate_mbit={t.link_rate_mbit} runs one worker per emulated node: set "
                          f"train.devices=1, train.num_nodes >= 2 (the workers), train.accelerator=cpu and run.name")
    reason = missing_requirements()
    if reason:
        raise ConfigError(reason)
    check_config(cfg)
    run_dir = Path(cfg.run.out_dir) / cfg.run.name
    cluster = Cluster(t.num_nodes, t.link_rate_mbit)
    previous = {s: signal.signal(s, interrupt) for s in (signal.SIGINT, signal.SIGTERM)}  # even where inherited
    try:
        with tempfile.TemporaryDirectory(prefix="lowcomm-cluster-") as tmp:
            cluster.create()
            rates = [measure_link(cluster, i) for i in range(cluster.workers)]
            print(f"emulated network: {cluster.workers} links capped at {cluster.rate_mbit:g} Mbit/s; measured "
                  + ", ".join(f"{r:.1f}" for r in rates) + " Mbit/s", flush=True)
            config_file = Path(tmp) / "config.yaml"
            OmegaConf.save(cfg.tree, config_file)
            status = run_agents(cluster, config_file, Path(tmp), grace_s=t.collective_timeout_s)
            if status != 0:
                logs = "".join((Path(tmp) / f"agent{i}.log").read_text()[-800:] for i in range(1, cluster.workers))
                raise RunEnded(f"the emulated-network run ended with status {status}; the last lines of the other "
                               f"agents:\n{logs}", status)
    finally:
        cluster.remove()
        for s, handler in previous.items():
            signal.signal(s, handler)
    record_file = run_dir / "record.json"
    record = json.loads(record_file.read_text())
    record["link_rate_measured_mbit"] = rates
    tmp_file = record_file.with_suffix(".json.tmp")
    tmp_file.write_text(json.dumps(record, indent=2))
    tmp_file.replace(record_file)
    return run_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rate-mbit", type=float, required=True, help="the cap of every worker's link")
    parser.add_argument("--name", default=None, help="run.name (default: emulated-<rate>mbit-<time>)")
    parser.add_argument("train", nargs=argparse.REMAINDER, help="-- CONFIG key=value ...")
    args = parser.parse_args(argv)
    rest = args.train[1:] if args.train[:1] == ["--"] else args.train
    path, overrides = (rest[0], rest[1:]) if rest and "=" not in rest[0] else (None, rest)
    name = args.name or f"emulated-{args.rate_mbit:g}mbit-{time.strftime('%Y%m%d-%H%M%S')}"
    overrides = [*overrides, f"train.num_nodes={args.workers}", "train.devices=1",
                 f"train.link_rate_mbit={args.rate_mbit}", f"run.name={name}"]
    run_command(lambda: launch(run_config(load_config(path, overrides))),
                "interrupted; the emulated network is removed")


if __name__ == "__main__":
    main()
