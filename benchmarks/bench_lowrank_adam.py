"""Cost of LoRDO's local step (LowRankAdam) against torch.optim.AdamW.

1. Time of one training step (forward, backward, optimizer step) and of the optimizer step alone, on
   identical models and one batch, for AdamW (torch's default implementation, as the registry builds
   it, and its foreach implementation) and LowRankAdam, taking turns step by step in one process; medians.
2. Optimizer-state bytes of a larger model at a given rank, from a model built on the meta device
   (no memory is allocated): LowRankAdam.state_bytes() against the state torch.optim.AdamW holds.

    .venv/bin/python benchmarks/bench_lowrank_adam.py [--size lordo-16m --context 256 --batch 4 ...]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path

import torch
from common import ROOT, git_commit

from lowcomm.model import Transformer, model_config
from lowcomm.optim import build_optimizer
from lowcomm.optim.projection import basis_rows, projection_side


def lordo_config(rank: int) -> dict:
    return {"name": "lordo_local_step", "rank": rank}


def loss_backward(model: Transformer, tokens: torch.Tensor) -> None:
    model.loss(tokens[:, :-1], tokens[:, 1:]).backward()


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def build_optimizers(size: str, context: int, rank: int, tokens: torch.Tensor) -> tuple[dict, dict]:
    """Identical models, each with its optimizer: AdamW as the registry builds it (torch's default
    implementation), the same with foreach kernels, and LowRankAdam as LoRDO's local step."""
    torch.manual_seed(0)
    base = Transformer(model_config(size, max_context=context))
    models = {name: copy.deepcopy(base) for name in ("adamw", "adamw_foreach", "lowrank_adam")}
    optimizers = {"adamw": build_optimizer({"name": "adamw"}, models["adamw"]),
                  "adamw_foreach": build_optimizer({"name": "adamw"}, models["adamw_foreach"]),
                  "lowrank_adam": build_optimizer(lordo_config(rank), models["lowrank_adam"])}
    for group in optimizers["adamw_foreach"].param_groups:
        group["foreach"] = True
    low = optimizers["lowrank_adam"]
    loss_backward(models["lowrank_adam"], tokens)
    low.set_bases_from([p.grad for p in low.lowrank_params()])  # D1: the basis of the first gradient
    low.zero_grad()
    return models, optimizers


def time_training_steps(size: str, context: int, batch: int, rank: int, repeats: int, warmup: int) -> dict:
    """Median seconds of forward+backward and of optimizer.step per optimizer; the optimizers take turns
    step by step, in an order rotated every repeat."""
    vocab = model_config(size).vocab_size
    tokens = torch.randint(0, vocab, (batch, context + 1), generator=torch.Generator().manual_seed(1))
    models, optimizers = build_optimizers(size, context, rank, tokens)
    names = list(models)
    samples = {name: {"forward_backward": [], "optimizer": []} for name in names}
    for i in range(warmup + repeats):
        for name in names[i % len(names):] + names[:i % len(names)]:
            opt = optimizers[name]
            opt.zero_grad()
            forward_backward = timed(lambda: loss_backward(models[name], tokens))
            optimizer = timed(opt.step)
            if i >= warmup:
                samples[name]["forward_backward"].append(forward_backward)
                samples[name]["optimizer"].append(optimizer)
    medians = {}
    for name, s in samples.items():
        totals = [a + b for a, b in zip(s["forward_backward"], s["optimizer"])]
        medians[name] = {"step_s": statistics.median(totals), "optimizer_s": statistics.median(s["optimizer"]),
                         "forward_backward_s": statistics.median(s["forward_backward"])}
    low = medians["lowrank_adam"]
    return {
        "medians": medians,
        "ratios": {baseline: {"step": low["step_s"] / medians[baseline]["step_s"],
                              "optimizer": low["optimizer_s"] / medians[baseline]["optimizer_s"]}
                   for baseline in ("adamw", "adamw_foreach")},
    }


def state_bytes_on_meta(size: str, rank: int) -> dict:
    """Optimizer-state bytes after one step of each optimizer on a meta-device model (shapes only)."""
    with torch.device("meta"):
        low_model, adamw_model = Transformer(model_config(size)), Transformer(model_config(size))
    low = build_optimizer(lordo_config(rank), low_model)
    for p in low.lowrank_params():
        low.set_basis(p, torch.empty(basis_rows(p.shape, projection_side(p.shape)), rank, device="meta"))
    adamw = build_optimizer({"name": "adamw"}, adamw_model)
    for model, opt in ((low_model, low), (adamw_model, adamw)):
        for p in model.parameters():
            p.grad = torch.empty_like(p)
        opt.step()
    adamw_state = {id(p): sum(t.numel() * t.element_size() for k, t in adamw.state[p].items() if k != "step")
                   for p in adamw_model.parameters()}
    hidden_ids = {id(p) for _, p in adamw_model.hidden_matrices()}
    lowrank = low.state_bytes()
    adamw_total = sum(adamw_state.values())
    adamw_hidden = sum(b for i, b in adamw_state.items() if i in hidden_ids)
    optimizer_states = lowrank["moments"] + lowrank["bases"] + lowrank["adamw_moments"]
    return {
        "lowrank_adam": lowrank,
        "adamw": {"hidden_matrices": adamw_hidden, "total": adamw_total},
        "ratio_hidden_moments": adamw_hidden / lowrank["moments"],
        "ratio_hidden_moments_and_bases": adamw_hidden / (lowrank["moments"] + lowrank["bases"]),
        "ratio_all_optimizer_states": adamw_total / optimizer_states,
        "ratio_all_including_error_feedback": adamw_total / (optimizer_states + lowrank["error_feedback"]),
    }


def print_tables(timing: dict, memory: dict, args) -> None:
    print(f"\nstep time, {args.size}, context {args.context}, batch {args.batch}, rank {args.rank}, "
          f"{torch.get_num_threads()} threads, median of {args.repeats}")
    print(f"{'optimizer':<14}{'fwd+bwd s':>11}{'opt.step s':>12}{'step s':>10}")
    for name, m in timing["medians"].items():
        print(f"{name:<14}{m['forward_backward_s']:>11.4f}{m['optimizer_s']:>12.4f}{m['step_s']:>10.4f}")
    for baseline, ratio in timing["ratios"].items():
        print(f"LowRankAdam / {baseline}: whole step {ratio['step']:.3f}x, optimizer step {ratio['optimizer']:.3f}x")
    mib = 2**20
    low = memory["lowrank_adam"]
    print(f"\noptimizer state, {args.memory_size}, rank {args.memory_rank} (MiB)")
    print(f"  AdamW: hidden matrices {memory['adamw']['hidden_matrices'] / mib:.1f}, "
          f"all parameters {memory['adamw']['total'] / mib:.1f}")
    print(f"  LowRankAdam: moments {low['moments'] / mib:.1f}, bases {low['bases'] / mib:.1f}, "
          f"AdamW part {low['adamw_moments'] / mib:.1f}, error feedback {low['error_feedback'] / mib:.1f}")
    print(f"  AdamW / LowRankAdam: hidden moments {memory['ratio_hidden_moments']:.2f}x, "
          f"hidden moments + bases {memory['ratio_hidden_moments_and_bases']:.2f}x, "
          f"all optimizer states {memory['ratio_all_optimizer_states']:.2f}x, "
          f"with error feedback {memory['ratio_all_including_error_feedback']:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="lordo-16m")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--rank", type=int, default=None, help="default d_model / 8")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="default: torch's default")
    parser.add_argument("--memory-size", default="lordo-125m")
    parser.add_argument("--memory-rank", type=int, default=96)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "bench" / "lowrank_adam.json")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.rank is None:
        args.rank = model_config(args.size).d_model // 8
    timing = time_training_steps(args.size, args.context, args.batch, args.rank, args.repeats, args.warmup)
    memory = state_bytes_on_meta(args.memory_size, args.memory_rank)
    print_tables(timing, memory, args)
    record = {
        "config": {k: v for k, v in vars(args).items() if k != "out"},  # no machine paths in results/
        "device": "cpu",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "git_commit": git_commit(),
        "timing": timing,
        "state_bytes": memory,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
