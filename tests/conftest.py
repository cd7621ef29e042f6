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
