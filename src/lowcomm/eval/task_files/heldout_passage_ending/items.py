"""The task's items as a `datasets` split, read from the JSONL next to this file (from any working directory)."""

from pathlib import Path

import datasets

ITEMS = Path(__file__).with_name("heldout_passage_ending.jsonl")


def load(**_) -> datasets.DatasetDict:
    """{"validation": the items of heldout_passage_ending.jsonl}; lm-eval's task metadata is ignored."""
    return datasets.load_dataset("json", data_files={"validation": str(ITEMS)})
