"""The lm-eval adapter against slow references, stub models through lm_eval.simple_evaluate, the offline task's
build, the hub tasks' failure in words, and a run's scores in its record."""

import importlib.util
import json
import re
import socket

import pytest
import torch
import torch.nn.functional as F
from lm_eval.api.instance import Instance
from lm_eval.api.registry import get_model
from torch import nn

from lowcomm.data import EOS, bible_passages, offline_split, train_bpe
from lowcomm.eval import tasks as eval_tasks
from lowcomm.eval.evaluate import (
    LowcommLM,
    evaluate_run_dir,
    main,
    run_lm_eval,
    task_scores,
)
from lowcomm.model import ModelConfig, Transformer

WINDOW = 16


@pytest.fixture(scope="module")
def byte_tokenizer():
    """Byte-level tokenizer without merges: one token per byte (256 bytes + EOS)."""
    return train_bpe(["x"], 257)


@pytest.fixture(scope="module")
def tiny_model():
    torch.manual_seed(0)
    return Transformer(ModelConfig(vocab_size=257, d_model=32, n_layers=2, n_heads=2, max_context=WINDOW)).eval()


class Bigram(nn.Module):
    """logits[b, t] = table[tokens[b, t]]: the next token depends on the current one only."""

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.table = nn.Parameter(table)
        self.calls = 0

    def forward(self, tokens):
        self.calls += 1
        return self.table[tokens]


class Oracle(nn.Module):
    """All probability on the next token of whichever `sequences` the input so far is a prefix of; uniform elsewhere."""

    def __init__(self, sequences: list[list[int]], vocab: int):
        super().__init__()
        self.vocab = vocab
        self.next = {tuple(s[: i + 1]): s[i + 1] for s in sequences for i in range(len(s) - 1)}

    def forward(self, tokens):
        logits = torch.zeros(*tokens.shape, self.vocab)
        for b, row in enumerate(tokens.tolist()):
            for t in range(len(row)):
                if tuple(row[: t + 1]) in self.next:
                    logits[b, t] = -1e4
                    logits[b, t, self.next[tuple(row[: t + 1])]] = 0.0
        return logits


def requests(kind, args):
    return [Instance(request_type=kind, doc={}, arguments=a, idx=0) for a in args]


def reference_loglikelihood(model, tok, context, continuation):
    """One forward per continuation token on the (left-truncated) tokens before it, no batching or padding."""
    if context:
        ctx, whole = tok.encode(context).ids, tok.encode(context + continuation).ids
    else:
        ctx = [tok.token_to_id(EOS)]
        whole = ctx + tok.encode(continuation).ids
    start = max(0, len(whole) - (WINDOW + 1))
    total, greedy = 0.0, True
    with torch.no_grad():
        for p in range(len(ctx), len(whole)):
            logp = F.log_softmax(model(torch.tensor([whole[start:p]]))[0, -1], dim=-1)
            total += float(logp[whole[p]])
            greedy &= int(logp.argmax()) == whole[p]
    return total, greedy


LL_ARGS = [
    ("The cat", " sat on the mat"),
    ("a", " b"),
    ("In the beginning God created the heaven and the earth.", " And the earth"),  # longer than the window
    ("", "xyz"),  # empty context: conditioned on EOS
    ("q", "1"), ("q", "2"), ("q", "3"),  # one-token continuations of one context share a forward
    ("ab", "c"), ("a", "bc"),  # the same tokens split differently also share one
]


def test_loglikelihood_equals_reference_single_and_batched(tiny_model, byte_tokenizer):
    expected = [reference_loglikelihood(tiny_model, byte_tokenizer, c, x) for c, x in LL_ARGS]
    for batch_size in (1, 3, 16):
        lm = LowcommLM(tiny_model, tokenizer=byte_tokenizer, batch_size=batch_size, device="cpu")
        got = lm.loglikelihood(requests("loglikelihood", LL_ARGS), disable_tqdm=True)
        for (logp, greedy), (ref_logp, ref_greedy) in zip(got, expected):
            assert logp == pytest.approx(ref_logp, abs=1e-5)
            assert greedy == ref_greedy


def test_rolling_loglikelihood_scores_every_token_once(byte_tokenizer):
    torch.manual_seed(1)
    table = torch.randn(257, 257)
    logp = F.log_softmax(table, dim=-1)
    texts = ["Every token of a text longer than the window is predicted exactly once.", "short"]
    expected = []
    for text in texts:
        ids = [byte_tokenizer.token_to_id(EOS)] + byte_tokenizer.encode(text).ids
        expected.append(sum(float(logp[a, b]) for a, b in zip(ids[:-1], ids[1:])))
    assert len(texts[0]) > 3 * WINDOW
    lm = LowcommLM(Bigram(table), tokenizer=byte_tokenizer, batch_size=4, max_length=WINDOW, device="cpu")
    got = lm.loglikelihood_rolling(requests("loglikelihood_rolling", [(t,) for t in texts]), disable_tqdm=True)
    assert got == pytest.approx(expected, abs=1e-4)


def successor_stub(tok, eos_after: str) -> Bigram:
    """Greedy decoding walks to the next token id; after `eos_after` comes EOS."""
    ids = torch.arange(257)
    nxt = (ids + 1) % 257
    nxt[tok.encode(eos_after).ids[0]] = tok.token_to_id(EOS)
    return Bigram(F.one_hot(nxt, 257).float() * 10)


def test_generate_until_stops_at_stop_string_max_tokens_and_eos(byte_tokenizer):
    lm = LowcommLM(successor_stub(byte_tokenizer, "k"), tokenizer=byte_tokenizer, batch_size=4, max_length=64,
                   device="cpu")
    args = [
        ("ab", {"until": ["de"], "max_gen_toks": 10, "do_sample": False}),  # "cde" hits "de": cut to "c"
        ("ab", {"until": ["zz"], "max_gen_toks": 3, "do_sample": False}),   # three tokens
        ("gh", {"until": ["zz"], "max_gen_toks": 10, "do_sample": False}),  # "ijk" then EOS
        ("mnop", {"until": ["\n\n", "s"], "max_gen_toks": 10, "do_sample": False}),
    ]
    assert lm.generate_until(requests("generate_until", args), disable_tqdm=True) == ["c", "cde", "ijk", "qr"]
    lm.model.calls = 0
    assert lm.generate_until(requests("generate_until", args[:1]), disable_tqdm=True) == ["c"]
    assert lm.model.calls == 3  # generation stopped when "de" appeared, not at max_gen_toks


def test_batched_greedy_generation_equals_one_at_a_time(tiny_model, byte_tokenizer):
    args = [(c, {"until": ["."], "max_gen_toks": 6}) for c in ("Once upon a time", "x", "The quick brown fox jumps")]
    outputs = [LowcommLM(tiny_model, tokenizer=byte_tokenizer, batch_size=b, device="cpu")
               .generate_until(requests("generate_until", args), disable_tqdm=True) for b in (1, 3)]
    assert outputs[0] == outputs[1]
    assert all(0 < len(o.encode()) <= 6 for o in outputs[0])


# ---------------------------------------------------------------- through lm_eval.simple_evaluate

ENDINGS = ["apple", "grape", "lemon", "mango"]  # equal byte lengths: a uniform model ties on every item


@pytest.fixture(scope="module")
def local_task(tmp_path_factory):
    """A 12-item HellaSwag-format task in a temporary include path; labels cycle 0..3."""
    root = tmp_path_factory.mktemp("tasks")
    items = [{"ctx": f"Item {i} asks for a fruit:", "endings": ENDINGS[i % 3:] + ENDINGS[: i % 3], "label": i % 4}
             for i in range(12)]
    (root / "fruit.jsonl").write_text("".join(json.dumps(x) + "\n" for x in items))
    (root / "fruit.yaml").write_text(
        "task: fruit_choice\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    validation: {root / 'fruit.jsonl'}\n"
        "output_type: multiple_choice\nvalidation_split: validation\n"
        "doc_to_text: '{{ctx}}'\ndoc_to_target: label\ndoc_to_choice: endings\n"
        "metric_list:\n  - metric: acc\n  - metric: acc_norm\n")
    return root, items


def scores_of(module, tok, local_task):
    root, _ = local_task
    manager, loaded, unavailable = eval_tasks.load_tasks(["fruit_choice"], root)
    assert not unavailable
    lm = LowcommLM(module, tokenizer=tok, batch_size=8, max_length=64, device="cpu")
    return task_scores(run_lm_eval(lm, manager, loaded))["fruit_choice"]


def test_oracle_scores_one_and_uniform_scores_chance(byte_tokenizer, local_task):
    _, items = local_task
    truths = [byte_tokenizer.encode(x["ctx"] + " " + x["endings"][x["label"]]).ids for x in items]
    oracle = scores_of(Oracle(truths, 257), byte_tokenizer, local_task)
    assert oracle["acc"] == 1.0 and oracle["acc_norm"] == 1.0 and oracle["items"] == 12
    uniform = scores_of(Bigram(torch.zeros(257, 257)), byte_tokenizer, local_task)
    assert uniform["acc"] == pytest.approx(0.25) and uniform["acc_norm"] == pytest.approx(0.25)
    assert uniform["acc_stderr"] == pytest.approx((0.25 * 0.75 / 11) ** 0.5)


# ---------------------------------------------------------------- the offline task

def test_offline_task_is_rebuilt_identically_and_its_answers_follow_their_contexts():
    folder = eval_tasks.TASKS_DIR / eval_tasks.OFFLINE_TASK
    spec = importlib.util.spec_from_file_location("build_offline_task", folder / "build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    items = build.build_items()
    committed = [json.loads(line) for line in (folder / f"{eval_tasks.OFFLINE_TASK}.jsonl").read_text().splitlines()]
    assert items == committed
    assert 300 <= len(items) <= 600
    validation, bible = offline_split()[1], set(bible_passages())
    for item in items[::17]:
        assert len(item["endings"]) == 4 and len(set(item["endings"])) == 4
        follows = [any(re.search(re.escape(item["ctx"]) + r"\s+" + re.escape(e), p) for p in validation)
                   for e in item["endings"]]
        assert follows == [i == item["label"] for i in range(4)]
        same_source = [p for p in validation if (p in bible) == (item["source"] == "bible")]
        assert all(any(e in p for p in same_source) for e in item["endings"])


# ---------------------------------------------------------------- hub tasks offline, run records

def test_paper_tasks_are_indexed_without_lm_evals_whole_task_index():
    manager = eval_tasks.task_manager([*eval_tasks.PAPER_TASKS, eval_tasks.OFFLINE_TASK])
    assert {*eval_tasks.PAPER_TASKS, eval_tasks.OFFLINE_TASK} <= set(manager.all_tasks)
    assert "gsm8k" not in manager.all_tasks  # in lm-eval's whole index, not in the paper tasks' folders


def test_hub_task_without_network_fails_in_one_line_before_any_work(run_dir, tmp_path, monkeypatch):
    """Offline switches off and no route to the hub: the probe fails, datasets use local copies only, no retries."""
    import datasets
    import huggingface_hub

    for key in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(key, "0")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    lookups = []

    def no_route(*args, **kwargs):
        lookups.append(args)
        raise OSError("no route to host")

    monkeypatch.setattr(socket, "create_connection", lambda *args, **kwargs: no_route() and None)
    monkeypatch.setattr(socket, "getaddrinfo", no_route)
    monkeypatch.setattr(LowcommLM, "__init__", lambda *args, **kwargs: pytest.fail("the model was loaded"))
    out = tmp_path / "results.json"
    with pytest.raises(SystemExit) as exc:
        main([str(run_dir), "--tasks", f"{eval_tasks.OFFLINE_TASK},arc_easy", "--output", str(out)])
    message = str(exc.value.code)
    assert message.count("\n") == 0 and "arc_easy needs the Hugging Face hub" in message
    assert "HF_DATASETS_OFFLINE=1" in message
    assert len(lookups) == 1 and not out.exists() and list(tmp_path.iterdir()) == []  # one probe, no retries


def test_lm_eval_builds_it_by_its_registered_name(run_dir):
    lm = get_model("lowcomm").create_from_arg_string(f"pretrained={run_dir},batch_size=4", {"device": "cpu"})
    assert isinstance(lm, LowcommLM) and lm.batch_size == 4 and lm.max_length == 64


def test_command_line_writes_results_and_one_line_per_task(run_dir, tmp_path, capsys):
    out = tmp_path / "results.json"
    main([str(run_dir / "model.pt"), "--tasks", eval_tasks.OFFLINE_TASK, "--limit", "6", "--batch-size", "4",
          "--output", str(out)])
    results = json.loads(out.read_text())["results"][eval_tasks.OFFLINE_TASK]
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line == (f"{eval_tasks.OFFLINE_TASK}: acc {results['acc,none']:.4f} +- {results['acc_stderr,none']:.4f}, "
                    f"acc_norm {results['acc_norm,none']:.4f} +- {results['acc_norm_stderr,none']:.4f} (6 items)")


def test_run_record_gets_offline_scores_and_needs_hub_in_words(run_dir):
    downstream = evaluate_run_dir(run_dir, tasks=(eval_tasks.OFFLINE_TASK, "arc_easy", "mmlu"), limit=8, batch_size=8)
    record = json.loads((run_dir / "record.json").read_text())
    assert record["status"] == "complete" and record["final_val_loss"] == 6.0
    assert record["downstream"] == downstream
    assert downstream["arc_easy"] == downstream["mmlu"] == "needs hub"
    offline = downstream[eval_tasks.OFFLINE_TASK]
    assert offline["items"] == 8 and 0.0 <= offline["acc"] <= 1.0 and offline["acc_stderr"] > 0
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.yaml", "model.pt", "record.json"]
