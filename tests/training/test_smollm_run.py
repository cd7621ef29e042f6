"""A run on the SmolLM corpus path, fed from local files of the hub's schema."""

import json
import math

from support import SMOKE, local_smollm_files

from lowcomm.config import load_config
from lowcomm.data import offline_split, train_bpe
from lowcomm.training.train import train


def test_smollm_run_reports_validation_loss(tmp_path):
    """Two workers train on local SmolLM-schema files with a tokenizer file; the held-out set gives a finite loss."""
    texts = offline_split()[0][:200]
    tokenizer = tmp_path / "tokenizer.json"
    train_bpe(texts, 512).save(str(tokenizer))
    files = local_smollm_files(tmp_path, texts, per_source=50)
    overrides = [*SMOKE, "data.corpus=smollm", f"data.tokenizer={tokenizer}", "data.val_documents=40",
                 "data.data_files={" + ", ".join(f"{k}: {v}" for k, v in files.items()) + "}",
                 "train.steps=4", "train.warmup=2", "train.val_every=2", "train.log_every=2", f"run.out_dir={tmp_path}",
                 "run.name=smollm"]
    record = json.loads((train(load_config(None, overrides)) / "record.json").read_text())
    assert math.isfinite(record["final_val_loss"]) and record["final_val_loss"] < record["initial_val_loss"]
