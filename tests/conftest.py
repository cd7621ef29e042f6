"""Test environment: offline hub, caches in a temp dir, one thread per process (2-core CI)."""

import os
import tempfile

_CACHE = tempfile.mkdtemp(prefix="lowcomm-test-cache-")
for key, sub in (("HF_HOME", "hf"), ("MPLCONFIGDIR", "mpl"), ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
                 ("LOWCOMM_CACHE", "lowcomm")):
    os.environ[key] = os.path.join(_CACHE, sub)
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"

import torch  # noqa: E402

torch.set_num_threads(1)


import json  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """An untrained smoke-size run on the offline corpus: config.yaml, model.pt, record.json."""
    from omegaconf import OmegaConf

    from lowcomm.config import load_config
    from lowcomm.model import ModelConfig, Transformer

    path = tmp_path_factory.mktemp("run")
    cfg = load_config(ROOT / "experiments" / "train" / "config.yaml",
                      ["model.size=smoke", "data.vocab_size=512", "data.context=64"])
    OmegaConf.save(cfg, path / "config.yaml")
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=512, d_model=64, n_layers=2, n_heads=2, max_context=64))
    torch.save({"model": model.state_dict(), "model_config": model.cfg}, path / "model.pt")
    (path / "record.json").write_text(json.dumps({"status": "complete", "final_val_loss": 6.0}))
    return path
