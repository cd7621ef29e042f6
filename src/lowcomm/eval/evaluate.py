"""`python -m lowcomm.eval.evaluate RUN_DIR_OR_MODEL_PT --tasks T1,T2 [--include-path DIR] [--limit N] [--batch-size B]
[--output results.json] [--device D]`: lm-evaluation-harness on a trained model.

`LowcommLM` (registered with lm-eval as `lowcomm`) is an lm_eval TemplateLM over our Transformer and its tokenizer,
built like lm-eval's HF backend: requests sorted by length and batched (one forward per batch, right-padded),
contexts truncated from the left to the model's window, greedy generation with stop strings, torch.inference_mode.
`evaluate_run_dir` scores a finished run and stores the scores in its record.json under `downstream`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import (
    Collator,
    handle_stop_sequences,
    normalize_gen_kwargs,
    postprocess_generated_text,
)
from torch import nn
from tqdm import tqdm

from lowcomm.data import (
    EOS,
    SMOLLM_TOKENIZER,
    DataUnavailable,
    load_tokenizer,
    offline_tokenizer,
)
from lowcomm.eval.tasks import (
    NEEDS_HUB,
    OFFLINE_TASK,
    PAPER_TASKS,
    TaskUnavailable,
    load_tasks,
)
from lowcomm.model import ModelConfig, Transformer
from lowcomm.quiet import no_progress_bars, quiet_libraries
from lowcomm.stored import RERUN, StoredFileError, read_config, read_json, reading


class EvaluationError(ValueError):
    """A model or run directory that cannot be evaluated; the message names the fix."""


# ---------------------------------------------------------------- model and tokenizer of a run

def run_tokenizer(data) -> object:
    """The tokenizer a run's `data` config section trained with: the offline BPE or data.tokenizer / SmolLM's."""
    if data.corpus == "offline":
        return offline_tokenizer(data.vocab_size)
    if data.corpus == "smollm":
        return load_tokenizer(data.get("tokenizer") or SMOLLM_TOKENIZER)
    raise EvaluationError(f"data.corpus={data.corpus!r} in the run's config.yaml is unknown: use 'offline' or 'smollm'")


def load_run(path: str | Path) -> tuple[Transformer, object]:
    """(model, tokenizer) of a run directory or of a model.pt inside one: the model built from the stored
    ModelConfig with the stored weights, the tokenizer named by the directory's config.yaml."""
    path = Path(path)
    weights = path if path.is_file() else path / "model.pt"
    config = weights.parent / "config.yaml"
    for needed in (weights, config):
        if not needed.exists():
            raise EvaluationError(f"{needed} does not exist: give a finished run directory (with model.pt and "
                                  "config.yaml) or the model.pt inside one")
    with torch.serialization.safe_globals([ModelConfig]), reading(weights, "a model file", RERUN):
        saved = torch.load(weights, map_location="cpu", weights_only=True)
        model = Transformer(saved["model_config"])
        model.load_state_dict(saved["model"])
    return model, run_tokenizer(read_config(config, RERUN).data)


# ---------------------------------------------------------------- the lm-eval model

@register_model("lowcomm")
class LowcommLM(TemplateLM):
    """lm-eval's view of a causal LM `model(tokens (B, T)) -> logits (B, T, V)` and its `tokenizers` tokenizer.

    `pretrained` is a run directory / model.pt (model and tokenizer loaded from it) or a module (then `tokenizer`
    is required). loglikelihood(context, continuation) = sum_j log p(cont_j | (context + cont)_<j), conditioned on
    the last `max_length` tokens when longer (left truncation, as lm-eval's HF backend).
    """

    def __init__(self, pretrained: str | Path | nn.Module, tokenizer=None, batch_size: int | str = 32,
                 max_length: int | None = None, max_gen_toks: int = 256, device: str | None = None):
        super().__init__()
        if isinstance(pretrained, (str, Path)):
            if tokenizer is not None:
                raise EvaluationError("give either a run directory (it names its tokenizer) or a model and a tokenizer")
            pretrained, tokenizer = load_run(pretrained)
        if tokenizer is None:
            raise EvaluationError("a model given as a module needs its tokenizer: LowcommLM(model, tokenizer=...)")
        if not str(batch_size).isdigit() or int(batch_size) < 1:
            raise EvaluationError(f"batch_size={batch_size!r}: give a positive integer (no 'auto' for lowcomm)")
        self._device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model = pretrained.to(self._device).eval()
        self.tokenizer = tokenizer
        self.batch_size = int(batch_size)
        self.max_length = max_length or pretrained.cfg.max_context
        self.max_gen_toks = max_gen_toks
        self._eot = tokenizer.token_to_id(EOS)
        if self._eot is None:
            raise EvaluationError(f"the tokenizer has no {EOS} token, which marks document starts and ends")

    @property
    def eot_token_id(self) -> int:
        return self._eot

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        return self.tokenizer.encode(string, add_special_tokens=add_special_tokens is not False).ids

    def tok_decode(self, tokens: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=skip_special_tokens)

    def get_model_info(self) -> dict:
        return {"model_num_parameters": sum(p.numel() for p in self.model.parameters())}

    @torch.inference_mode()
    def _model_logits(self, rows: list[list[int]]) -> torch.Tensor:
        """Logits (B, T_max, V) for token rows of any lengths, right-padded: a causal model's outputs at a row's
        own positions do not depend on the padding after them."""
        width = max(len(r) for r in rows)
        batch = torch.zeros(len(rows), width, dtype=torch.long, device=self._device)
        for i, row in enumerate(rows):
            batch[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        return self.model(batch)

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """(sum of log p(continuation), whether greedy decoding gives it) per (strings, context ids, continuation
        ids); requests that share context + continuation[:-1] share one forward (lm-eval's "contexts" grouping)."""
        results = []
        reorder = Collator(requests, sort_fn=lambda r: (-len(r[1] + r[2]), tuple(r[1] + r[2])),
                           group_by="contexts", group_fn=lambda r: r[1] + r[2][:-1])
        pbar = tqdm(total=len(requests), disable=disable_tqdm, desc="Running loglikelihood requests")
        for chunk in reorder.get_batched(n=self.batch_size):
            if any(len(cont) > self.max_length for _, _, cont in chunk):
                raise EvaluationError(f"a continuation is longer than the model's window of {self.max_length} tokens")
            windows = [(ctx + cont)[-(self.max_length + 1):][:-1] for _, ctx, cont in chunk]
            for (strings, ctx, cont), window, logits in zip(chunk, windows, self._model_logits(windows)):
                scored = F.log_softmax(logits[len(window) - len(cont): len(window)].float(), dim=-1)[None]
                for strings, cont_toks, scored in reorder.get_cache(req_str=strings, cxt_toks=ctx, cont_toks=cont,
                                                                    logits=scored):
                    target = torch.tensor(cont_toks, dtype=torch.long, device=self._device)
                    scored = scored[0, scored.shape[1] - len(cont_toks):]
                    answer = (float(scored.gather(1, target[:, None]).sum()), bool((scored.argmax(-1) == target).all()))
                    results.append(answer)
                    if strings is not None:
                        self.cache_hook.add_partial("loglikelihood", strings, answer)
                    pbar.update(1)
        pbar.close()
        return reorder.get_original(results)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """log p(string) from EOS on, every token scored once, in lm-eval's disjoint rolling windows of max_length."""
        windows, owners = [], []
        for i, (string,) in enumerate(req.args for req in requests):
            for ctx, cont in map(lm_utils.make_disjoint_window, lm_utils.get_rolling_token_windows(
                    token_list=self.tok_encode(string), prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length, context_len=1)):
                windows.append((None, ctx, cont))
                owners.append(i)
        totals = [0.0] * len(requests)
        for i, (logprob, _) in zip(owners, self._loglikelihood_tokens(windows, disable_tqdm=disable_tqdm)):
            totals[i] += logprob
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy continuations, batched by equal generation kwargs; each stops at EOS, at a stop string (cut off)
        or after max_gen_toks tokens. The context keeps its last max_length - max_gen_toks tokens."""
        results = []
        reorder = Collator([req.args for req in requests], sort_fn=lambda r: (-len(self.tok_encode(r[0])), r[0]),
                           group_by="gen_kwargs", group_fn=lambda r: r[1])
        pbar = tqdm(total=len(requests), disable=disable_tqdm, desc="Running generate_until requests")
        eos = self.tok_decode([self.eot_token_id], skip_special_tokens=False)
        for chunk in reorder.get_batched(n=self.batch_size):
            contexts, all_kwargs = zip(*chunk)
            kwargs = normalize_gen_kwargs(all_kwargs[0], self.max_gen_toks)
            if kwargs["do_sample"]:
                raise EvaluationError("lowcomm generates greedily: set do_sample: false in generation_kwargs")
            until = handle_stop_sequences(kwargs["until"], eos=eos)
            max_gen_toks = kwargs["max_gen_toks"]
            room = self.max_length - max_gen_toks
            if room < 1:
                raise EvaluationError(f"max_gen_toks={max_gen_toks} leaves no room for a context in the model's "
                                      f"{self.max_length} tokens: lower max_gen_toks in the task's generation_kwargs")
            prompts = [self.tok_encode(c)[-room:] or [self.prefix_token_id] for c in contexts]
            for context, gen_kwargs, text in zip(contexts, all_kwargs, self._greedy(prompts, until, max_gen_toks)):
                results.append(text)
                self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
                pbar.update(1)
        pbar.close()
        return reorder.get_original(results)

    def _greedy(self, prompts: list[list[int]], until: list[str], max_gen_toks: int) -> list[str]:
        """Greedy generation for a batch of prompts: one forward per step over the unfinished rows."""
        rows = [list(p) for p in prompts]
        generated: list[list[int]] = [[] for _ in prompts]
        active = list(range(len(prompts)))
        for _ in range(max_gen_toks):
            if not active:
                break
            logits = self._model_logits([rows[i] for i in active])
            last = torch.tensor([len(rows[i]) - 1 for i in active], device=self._device)
            next_tokens = logits[torch.arange(len(active), device=self._device), last].argmax(-1).tolist()
            unfinished = []
            for i, token in zip(active, next_tokens):
                rows[i].append(token)
                if token == self.eot_token_id:
                    continue
                generated[i].append(token)
                if not any(stop and stop in self.tok_decode(generated[i]) for stop in until):
                    unfinished.append(i)
            active = unfinished
        return [postprocess_generated_text(self.tok_decode(g), until, None) for g in generated]


# ---------------------------------------------------------------- evaluation and scores

def run_lm_eval(lm: LowcommLM, manager, loaded: dict[str, list], limit: float | None = None) -> dict:
    """lm-eval's results dict for the loaded tasks (lm_eval.simple_evaluate, 0-shot unless a task says otherwise)."""
    import lm_eval

    quiet_libraries()
    tasks = [obj for objs in loaded.values() for obj in objs]
    with no_progress_bars():
        return lm_eval.simple_evaluate(model=lm, tasks=tasks, task_manager=manager, limit=limit, log_samples=False)


def top_level_names(loaded: dict[str, list]) -> list[str]:
    """The names lm-eval reports the loaded tasks and groups under (a tag stands for its tasks)."""
    return [obj.task_name if hasattr(obj, "task_name") else obj.name for objs in loaded.values() for obj in objs]


def task_scores(results: dict) -> dict[str, dict]:
    """{task or group: {acc, acc_stderr, acc_norm, acc_norm_stderr, items}} of the metrics lm-eval reported."""
    scores = {}
    for name, metrics in results["results"].items():
        row = {k.split(",")[0]: v for k, v in metrics.items()
               if k.split(",")[0] in ("acc", "acc_stderr", "acc_norm", "acc_norm_stderr")}
        if name in results.get("n-samples", {}):
            row["items"] = results["n-samples"][name]["effective"]
        scores[name] = row
    return scores


def summary_line(name: str, row: dict | str) -> str:
    """One line per task: acc and acc_norm with their standard errors, or why there is no score."""
    if isinstance(row, str):
        return f"{name}: {row}"
    parts = [f"{m} {row[m]:.4f} +- {row[m + '_stderr']:.4f}" if isinstance(row.get(m + "_stderr"), float)
             else f"{m} {row[m]:.4f}" for m in ("acc", "acc_norm") if m in row]
    items = f" ({row['items']} items)" if "items" in row else ""
    return f"{name}: {', '.join(parts)}{items}"


def write_json_atomic(path: Path, obj: dict) -> None:
    """Write `obj` as JSON to a temporary file beside `path`, then rename it over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=lm_utils.handle_non_serializable) + "\n")
    os.replace(tmp, path)


def evaluate_run_dir(run_dir: str | Path, tasks: tuple[str, ...] | list[str] = (OFFLINE_TASK, *PAPER_TASKS),
                     limit: float | None = None, batch_size: int = 32, device: str | None = None) -> dict:
    """Score a finished run's model on `tasks` and merge {task: scores, or "needs hub"} into the `downstream`
    entry of its record.json (rewritten atomically); returns the new entries."""
    run_dir = Path(run_dir)
    record_path = run_dir / "record.json"
    if not record_path.exists():
        raise EvaluationError(f"{record_path} does not exist: evaluate a finished run")
    manager, loaded, unavailable = load_tasks(list(tasks))
    downstream = {name: NEEDS_HUB for name in unavailable}
    if loaded:
        lm = LowcommLM(run_dir, batch_size=batch_size, device=device)
        scores = task_scores(run_lm_eval(lm, manager, loaded, limit))
        downstream.update({name: scores[name] for name in top_level_names(loaded)})
    record = read_json(record_path, RERUN)
    record["downstream"] = {**record.get("downstream", {}), **downstream}
    write_json_atomic(record_path, record)
    return downstream


# ---------------------------------------------------------------- command line

def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m lowcomm.eval.evaluate", description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a run directory (with model.pt and config.yaml) or the model.pt inside one")
    parser.add_argument("--tasks", required=True, help=f"comma-separated lm-eval task names, e.g. {OFFLINE_TASK} "
                        f"(offline) or {','.join(PAPER_TASKS)} (need the hub)")
    parser.add_argument("--include-path",
                        help="a folder of extra task YAML files (the package's task_files/ is always included)")
    parser.add_argument("--limit", type=float, help="at most this many items per task (a fraction when < 1)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--device", help="torch device (default: cuda when available, else cpu)")
    parser.add_argument("--output", type=Path, help="write lm-eval's results JSON here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    names = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if args.batch_size < 1 or (args.limit is not None and args.limit <= 0):
        sys.exit("error: --batch-size and --limit must be positive")
    try:
        manager, loaded, unavailable = load_tasks(names, args.include_path)
        if unavailable:
            sys.exit("\n".join(f"error: {message}" for message in unavailable.values()))
        lm = LowcommLM(args.model, batch_size=args.batch_size, device=args.device)
    except (EvaluationError, TaskUnavailable, DataUnavailable, StoredFileError) as err:
        sys.exit(f"error: {err}")
    results = run_lm_eval(lm, manager, loaded, args.limit)
    if args.output:
        write_json_atomic(args.output, results)
    scores = task_scores(results)
    for name in top_level_names(loaded):
        print(summary_line(name, scores[name]))


if __name__ == "__main__":
    main()
