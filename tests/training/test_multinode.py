"""The README's multi-node torchrun command, run as two agents on one machine (gloo): it must train and end with
bit-identical replicas."""

import json
import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from support import SMOKE

from lowcomm.training.validation import started_by_launcher

pytestmark = pytest.mark.slow  # trains with several worker processes

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_commands(program: str) -> list[str]:
    """The README's shell commands (in ```bash blocks, continuation lines joined) that start with `program`."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S):
        for command in block.replace("\\\n", " ").splitlines():
            if command.startswith(program + " "):
                commands.append(command)
    return commands


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_readme_torchrun_command_trains_two_nodes_on_one_machine(tmp_path):
    (command,) = readme_commands("torchrun")
    config = tmp_path / "smoke.yaml"
    OmegaConf.save(OmegaConf.from_dotlist([o for o in SMOKE if not o.startswith("train.devices=")]
                                          + ["train.steps=16", "train.val_every=8", f"run.out_dir={tmp_path}"]), config)
    values = {"NODES": "2", "DEVICES": "1", "HEAD": "127.0.0.1", "PORT": str(free_port()), "CONFIG": str(config),
              "NAME": "two_nodes"}
    expanded = re.sub(r"\$(\w+)", lambda m: values[m[1]], command)
    args = [sys.executable, "-m", "torch.distributed.run", *shlex.split(expanded)[1:]]
    agents = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "OMP_NUM_THREADS": "1"}) for _ in range(2)]
    try:
        outputs = [agent.communicate(timeout=300)[0] for agent in agents]
    finally:
        for agent in agents:
            agent.kill()
    for agent, output in zip(agents, outputs):
        assert agent.returncode == 0, output[-3000:]
    record = json.loads((tmp_path / "two_nodes" / "record.json").read_text())
    assert record["status"] == "complete" and record["world_size"] == 2 and record["steps"] == 16
    assert record["replicas_identical"] is True
    assert record["final_val_loss"] < record["initial_val_loss"]


@pytest.mark.parametrize("environ", [{}, {"TORCHELASTIC_RUN_ID": "1"}, {"SLURM_NTASKS": "2"},
                                     {"SLURM_NTASKS": "2", "SLURM_JOB_NAME": "interactive"},
                                     {"SLURM_NTASKS": "2", "SLURM_JOB_NAME": "train"}])
def test_launcher_detection_agrees_with_lightnings(environ, monkeypatch):
    """The validation path detects torchrun and srun without importing Lightning, as Lightning itself does."""
    from lightning.fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment

    for key in ("TORCHELASTIC_RUN_ID", "SLURM_NTASKS", "SLURM_JOB_NAME"):
        monkeypatch.delenv(key, raising=False)
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    assert started_by_launcher() == (TorchElasticEnvironment.detect() or SLURMEnvironment.detect())
