"""The paper's tasks through lm-eval's own definitions on local files: items written here in each dataset's schema,
scored by `python -m lowcomm.eval.evaluate` with the including YAMLs, against a direct computation of every choice's
log-likelihood with the prompt written out by hand from the task's definition (acc and acc_norm, to the item)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lowcomm.eval import local_tasks
from lowcomm.eval.evaluate import LowcommLM, main

ARC = [{"id": "a1", "question": "Which of these is a source of light?",
        "choices": {"text": ["the sun", "a stone", "the moon at noon"], "label": ["A", "B", "C"]}, "answerKey": "A"},
       {"id": "a2", "question": "What do plants need to grow?",
        "choices": {"text": ["water and light", "sand only", "darkness", "salt"], "label": ["1", "2", "3", "4"]},
        "answerKey": "1"},
       {"id": "a3", "question": "What is ice?", "choices": {"text": ["frozen water", "hot air"], "label": ["A", "B"]},
        "answerKey": "A"}]
HELLASWAG = [{"ind": 1, "activity_label": "Baking cookies", "ctx_a": "A woman mixes flour and sugar in a bowl.",
              "ctx_b": "she", "endings": ["pours the dough onto a tray.", "jumps into a lake.",
                                          "reads a newspaper aloud.", "paints the ceiling."], "label": "0",
              "split": "val", "split_type": "indomain", "source_id": "x"},
             {"ind": 2, "activity_label": "Running", "ctx_a": "A man runs along the beach.", "ctx_b": "he",
              "endings": ["stops to drink water.", "sings to a fish.", "eats the sand.", "flies away."],
              "label": "0", "split": "val", "split_type": "indomain", "source_id": "y"}]
PIQA = [{"goal": "To dry wet hands,", "sol1": "rub them with a towel.", "sol2": "dip them in a lake.", "label": 0},
        {"goal": "To open a locked door,", "sol1": "sing to it.", "sol2": "use its key.", "label": 1}]
MMLU = [{"question": "Which organ pumps blood?", "subject": "anatomy", "choices": ["heart", "lung", "skin", "bone"],
         "answer": 0},
        {"question": "How many bones are in the adult human body? ", "subject": "anatomy",
         "choices": ["12", "206", "1000", "3"], "answer": 1}]

ARC_CHALLENGE = [{**item, "id": f"c{i}"} for i, item in enumerate(ARC)]


def arc_prompts(item):
    return f"Question: {item['question']}\nAnswer:", item["choices"]["text"], \
        item["choices"]["label"].index(item["answerKey"])


def hellaswag_prompts(item):
    ctx = item["ctx_a"] + " " + item["ctx_b"].capitalize()
    return f"{item['activity_label']}: {ctx}", item["endings"], int(item["label"])


def piqa_prompts(item):
    return f"Question: {item['goal']}\nAnswer:", [item["sol1"], item["sol2"]], item["label"]


def mmlu_prompts(item):
    c = item["choices"]
    text = (f"The following are multiple choice questions (with answers) about anatomy.\n\n{item['question'].strip()}\n"
            f"A. {c[0]}\nB. {c[1]}\nC. {c[2]}\nD. {c[3]}\nAnswer:")
    return text, ["A", "B", "C", "D"], item["answer"]


TASKS = {"arc_easy": ("test", ARC, arc_prompts), "arc_challenge": ("test", ARC_CHALLENGE, arc_prompts),
         "hellaswag": ("validation", HELLASWAG, hellaswag_prompts), "piqa": ("validation", PIQA, piqa_prompts),
         "mmlu_anatomy": ("test", MMLU, mmlu_prompts)}


def loglikelihood(lm: LowcommLM, context: str, continuation: str) -> float:
    """log p(continuation | context): one forward per continuation token over the (left-truncated) tokens before
    it, no batching; the pair split as lm-eval does (context tokens, then those of context + continuation)."""
    tok, model, window = lm.tokenizer, lm.model, lm.max_length
    ctx, whole = tok.encode(context).ids, tok.encode(context + continuation).ids
    total = 0.0
    with torch.no_grad():
        for p in range(len(ctx), len(whole)):
            logits = model(torch.tensor([whole[max(0, p - window):p]]))[0, -1]
            total += float(F.log_softmax(logits.float(), dim=-1)[whole[p]])
    return total


def direct_scores(lm: LowcommLM, items, prompts) -> tuple[float, float]:
    """(acc, acc_norm) over the items: argmax of the choices' log-likelihoods, and of those over the choice lengths."""
    acc, acc_norm = [], []
    for item in items:
        context, choices, gold = prompts(item)
        lls = np.array([loglikelihood(lm, context, " " + choice) for choice in choices])
        acc.append(float(np.argmax(lls) == gold))
        acc_norm.append(float(np.argmax(lls / np.array([len(c) for c in choices])) == gold))
    return float(np.mean(acc)), float(np.mean(acc_norm))


@pytest.fixture(scope="module")
def local_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("local-data")
    for task, (split, items, _) in TASKS.items():
        (root / task).mkdir()
        (root / task / f"{split}.jsonl").write_text("".join(json.dumps(item) + "\n" for item in items))
    return root


def test_paper_tasks_score_the_local_items_as_a_direct_computation(run_dir, local_data, tmp_path, capsys):
    local_tasks.main([str(local_data), "--out", str(tmp_path / "tasks")])
    names = sorted(p.stem for p in (tmp_path / "tasks").glob("*.yaml"))
    assert names == sorted([f"{t}_local" for t in TASKS] + ["mmlu_local"])
    out = tmp_path / "results.json"
    requested = [f"{t}_local" for t in TASKS if not t.startswith("mmlu_")] + ["mmlu_local"]  # the group runs anatomy
    main([str(run_dir), "--tasks", ",".join(requested), "--include-path",
          str(tmp_path / "tasks"), "--batch-size", "3", "--output", str(out)])
    results = json.loads(out.read_text())
    lm = LowcommLM(run_dir, batch_size=1, device="cpu")
    for task, (_, items, prompts) in TASKS.items():
        got = results["results"][f"{task}_local"]
        acc, acc_norm = direct_scores(lm, items, prompts)
        assert results["n-samples"][f"{task}_local"]["effective"] == len(items), task
        assert got["acc,none"] == pytest.approx(acc), task
        if task != "mmlu_anatomy":  # MMLU reports acc only
            assert got["acc_norm,none"] == pytest.approx(acc_norm), task
    assert results["results"]["mmlu_local"]["acc,none"] == pytest.approx(results["results"]["mmlu_anatomy_local"]
                                                                          ["acc,none"])
    printed = capsys.readouterr().out
    assert "arc_easy_local: acc" in printed and "(3 items)" in printed


def test_the_prompt_is_the_tasks_own(run_dir, local_data, tmp_path):
    """The including YAML keeps lm-eval's template: the requests lm-eval builds carry the hand-written prompts."""
    from lowcomm.eval.tasks import load_tasks

    local_tasks.write_task_yamls(local_data, tmp_path)
    _, loaded, _ = load_tasks(["hellaswag_local", "mmlu_anatomy_local"], tmp_path)
    for name, prompts, items in (("hellaswag_local", hellaswag_prompts, HELLASWAG),
                                 ("mmlu_anatomy_local", mmlu_prompts, MMLU)):
        task = loaded[name][0]
        docs = list(task.eval_docs)
        assert task.doc_to_text(docs[0]) in prompts(items[0])[0]
        assert task.doc_to_choice(docs[0]) == prompts(items[0])[1]


def test_local_files_that_cannot_stand_for_a_task_are_named(tmp_path):
    (tmp_path / "data" / "piqa").mkdir(parents=True)
    (tmp_path / "data" / "piqa" / "validation.jsonl").write_text(json.dumps({"goal": "g", "sol1": "a"}) + "\n")
    with pytest.raises(SystemExit, match=r"validation.jsonl:1: no field\(s\) \['sol2', 'label'\]"):
        local_tasks.main([str(tmp_path / "data"), "--out", str(tmp_path / "tasks")])
    (tmp_path / "data" / "piqa" / "validation.jsonl").rename(tmp_path / "data" / "piqa" / "train.jsonl")
    with pytest.raises(SystemExit, match="no validation.jsonl: piqa is scored on its validation split"):
        local_tasks.main([str(tmp_path / "data"), "--out", str(tmp_path / "tasks")])
    (tmp_path / "data" / "piqa" / "train.jsonl").unlink()
    (tmp_path / "data" / "piqa").rmdir()
    (tmp_path / "data" / "winogrande").mkdir()
    with pytest.raises(SystemExit, match="winogrande: not a paper task's folder"):
        local_tasks.main([str(tmp_path / "data"), "--out", str(tmp_path / "tasks")])
    assert not (tmp_path / "tasks").exists()
