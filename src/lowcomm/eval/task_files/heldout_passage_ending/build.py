"""Build heldout_passage_ending.jsonl: a 4-way multiple-choice task in the HellaSwag format from the held-out
(validation) passages of the offline corpus.

Each item is an excerpt of a held-out passage: `ctx` is its first ~CONTEXT_CHARS characters, the true ending
its next ~ENDING_CHARS characters (both cut at whitespace); the three other `endings` are the true endings of
excerpts of other held-out passages of the same source (Bible or Shakespeare), so genre alone does not give
the answer. `label` is the true ending's index. Deterministic: the same corpus packages give the same file.

    python src/lowcomm/eval/task_files/heldout_passage_ending/build.py [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from lowcomm.data import bible_passages, offline_split

CONTEXT_CHARS = 200
ENDING_CHARS = 30
EXCERPT_STRIDE = 600  # excerpt k > 0 of a passage starts at the first whole word after character k * EXCERPT_STRIDE
EXCERPTS_PER_PASSAGE = 3
CHOICES = 4
SEED = 0
OUT = Path(__file__).with_name("heldout_passage_ending.jsonl")


def word_start(text: str, i: int) -> int:
    """Index of the first non-space character at or after i (len(text) if none)."""
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def word_end(text: str, i: int) -> int:
    """Index of the first whitespace character at or after i (len(text) if none)."""
    while i < len(text) and not text[i].isspace():
        i += 1
    return i


def excerpt(passage: str, start: int) -> tuple[str, str] | None:
    """(context, ending) of the excerpt starting at the passage start (start 0) or at the first whole word after
    `start`; None when the passage ends before the ending is complete."""
    begin = word_start(passage, start if start == 0 else word_end(passage, start))
    cut = word_end(passage, begin + CONTEXT_CHARS)
    ending_begin = word_start(passage, cut)
    ending_end = word_end(passage, ending_begin + ENDING_CHARS)
    if ending_begin + ENDING_CHARS >= len(passage):
        return None
    return passage[begin:cut].strip(), passage[ending_begin:ending_end].strip()


def build_items() -> list[dict]:
    """The task's items, in passage order."""
    validation = offline_split()[1]
    bible = set(bible_passages())
    excerpts = []  # (passage index, excerpt index, source, context, ending)
    for p, passage in enumerate(validation):
        source = "bible" if passage in bible else "shakespeare"
        for k in range(EXCERPTS_PER_PASSAGE):
            cut = excerpt(passage, k * EXCERPT_STRIDE)
            if cut is not None:
                excerpts.append((p, k, source, *cut))
    rng = random.Random(SEED)
    items = []
    for p, k, source, context, ending in excerpts:
        pool = sorted({e[4] for e in excerpts if e[2] == source and e[0] != p and e[4] != ending})
        endings = rng.sample(pool, CHOICES - 1)
        label = rng.randrange(CHOICES)
        endings.insert(label, ending)
        items.append({"id": f"val{p:03d}-{k}", "source": source, "ctx": context, "endings": endings, "label": label})
    return items


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help=f"output JSONL (default {OUT})")
    args = parser.parse_args(argv)
    items = build_items()
    args.out.write_text("".join(json.dumps(item, ensure_ascii=False) + "\n" for item in items), encoding="utf-8")
    print(f"{len(items)} items -> {args.out}")


if __name__ == "__main__":
    main()
