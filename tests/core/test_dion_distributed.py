"""Compressed data-parallel Dion on 2 gloo processes.

Each worker feeds its own gradients; gradients of compressed matrices are never all-reduced. Checked: both
replicas apply identical updates; they equal a single-process Dion fed the mean gradient at every step (the
update depends on the buffers only through their mean, and the mean buffer follows the single-process buffer);
each replica keeps its own buffer until synchronize_for_checkpoint() averages them; the ledger holds
(m + n) r numbers per compressed matrix per step.
"""

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lowcomm.distributed.comm import Communicator
from lowcomm.optim import Dion

pytestmark = pytest.mark.slow  # trains with several worker processes

WORLD = 2
STEPS_BEFORE_SYNC = 3
BYTES = 4  # float32
SHAPES = {"tall": (24, 16), "wide": (16, 24), "square": (8, 8), "norm": (24,)}
MATRICES = ("tall", "wide", "square")
CONFIGS = {
    "dion": dict(normalization="column"),
    "orth_dion": dict(normalization="qr", qr_method="cholesky_qr", ef_beta=0.5),
    "ada_orth_dion": dict(normalization="qr", adaptive_rank=True, rank_fraction=1.0, r_min=8, rank_gamma=0.5),
}


def make_params() -> dict[str, torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(0)
    return {name: torch.nn.Parameter(torch.randn(*shape, generator=generator)) for name, shape in SHAPES.items()}


def make_optimizer(params, options, communicator=None) -> Dion:
    """tall and wide are compressed at rank fraction 0.25; square runs at full rank, so it all-reduces its gradient.
    Ada-Orth-Dion starts tall and wide at full rank (gradient all-reduce) and compresses once the rank falls."""
    groups = [dict(params=[params["tall"], params["wide"]], names=["tall", "wide"]),
              dict(params=[params["square"]], names=["square"], rank_fraction=1.0),
              dict(params=[params["norm"]], names=["norm"], algorithm="adamw", weight_decay=0.0)]
    return Dion(groups, communicator=communicator, **{"lr": 0.02, "rank_fraction": 0.25, **options})


def worker_gradients(rank: int, step: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 * step + rank)
    return {name: torch.randn(*shape, generator=generator) for name, shape in SHAPES.items()}


def mean_gradients(step: int) -> dict[str, torch.Tensor]:
    grads = [worker_gradients(rank, step) for rank in range(WORLD)]
    return {name: sum(g[name] for g in grads) / WORLD for name in SHAPES}


def snapshot(params, opt) -> dict:
    return {
        "params": {name: p.detach().clone() for name, p in params.items()},
        "momentum": {name: opt.state[params[name]]["momentum"].clone() for name in MATRICES},
        "Q": {name: opt.state[params[name]]["Q"].clone() for name in MATRICES},
    }


def train(params, opt, steps, gradients, communicator=None) -> list[dict]:
    trace = []
    for step in steps:
        if communicator is not None:
            communicator.step = step
        for name, g in gradients(step).items():
            params[name].grad = g
        opt.step()
        trace.append(snapshot(params, opt))
    return trace


def _worker(rank: int, rendezvous: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=WORLD)
    results = {}
    for config, options in CONFIGS.items():
        comm = Communicator()
        params = make_params()
        opt = make_optimizer(params, options, communicator=comm)
        before = train(params, opt, range(STEPS_BEFORE_SYNC), lambda s: worker_gradients(rank, s), comm)
        comm.step = STEPS_BEFORE_SYNC
        opt.synchronize_for_checkpoint()
        synced = snapshot(params, opt)
        after = train(params, opt, [STEPS_BEFORE_SYNC + 1], lambda s: worker_gradients(rank, s), comm)
        records = [(r.step, r.kind, r.payload) for r in comm.records]
        results[config] = dict(before=before, synced=synced, after=after, records=records)
    torch.save(results, f"{out_dir}/rank{rank}.pt")
    dist.destroy_process_group()


def payload_by_step(records, step, kind):
    return sum(payload for s, k, payload in records if s == step and k == kind)


def test_compressed_sync_matches_single_process_on_the_mean_gradient(tmp_path):
    mp.spawn(_worker, args=(f"file://{tmp_path}/rendezvous", str(tmp_path)), nprocs=WORLD, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    for config, options in CONFIGS.items():
        params = make_params()
        opt = make_optimizer(params, options)
        reference = train(params, opt, range(STEPS_BEFORE_SYNC), mean_gradients)
        reference_after = train(params, opt, [STEPS_BEFORE_SYNC + 1], mean_gradients)
        mine, other = ranks[0][config], ranks[1][config]
        replica_buffers_differ = False
        for step, ref in enumerate(reference):
            states = [mine["before"][step], other["before"][step]]
            for name in SHAPES:  # identical updates on both replicas, equal to the single-process update
                assert torch.equal(states[0]["params"][name], states[1]["params"][name]), (config, step, name)
                torch.testing.assert_close(states[0]["params"][name], ref["params"][name], rtol=0, atol=1e-5)
            for name in MATRICES:
                assert torch.equal(states[0]["Q"][name], states[1]["Q"][name])
                mean_buffer = (states[0]["momentum"][name] + states[1]["momentum"][name]) / 2
                torch.testing.assert_close(mean_buffer, ref["momentum"][name], rtol=0, atol=1e-5)
                replica_buffers_differ |= not torch.allclose(states[0]["momentum"][name],
                                                             states[1]["momentum"][name], atol=1e-3)
            ranks_now = {name: states[0]["Q"][name].shape[1] for name in MATRICES}
            compressed = [n for n in MATRICES if (sum(SHAPES[n]) * ranks_now[n] < SHAPES[n][0] * SHAPES[n][1])]
            assert compressed == (["tall", "wide"] if config != "ada_orth_dion" or step > 0 else [])
            factor_numbers = sum(sum(SHAPES[n]) * ranks_now[n] for n in compressed)  # (m + n) r per matrix
            gradient_numbers = sum(torch.Size(SHAPES[n]).numel() for n in SHAPES if n not in compressed)
            assert payload_by_step(mine["records"], step, "factor") == BYTES * factor_numbers
            assert payload_by_step(mine["records"], step, "gradient") == BYTES * gradient_numbers
        assert replica_buffers_differ, "replicas should keep their own buffers between checkpoints"
        for name in MATRICES:  # after synchronize_for_checkpoint every replica holds the single-process buffer
            assert torch.equal(mine["synced"]["momentum"][name], other["synced"]["momentum"][name])
            torch.testing.assert_close(mine["synced"]["momentum"][name], reference[-1]["momentum"][name],
                                       rtol=0, atol=1e-5)
        state_numbers = sum(torch.Size(SHAPES[n]).numel() for n in MATRICES)
        assert payload_by_step(mine["records"], STEPS_BEFORE_SYNC, "optimizer_state") == BYTES * state_numbers
        for name in SHAPES:  # averaging the buffers leaves the trajectory unchanged
            torch.testing.assert_close(mine["after"][0]["params"][name], reference_after[0]["params"][name],
                                       rtol=0, atol=1e-5)
    adaptive_ranks = [ranks[0]["ada_orth_dion"]["before"][s]["Q"]["tall"].shape[1] for s in range(STEPS_BEFORE_SYNC)]
    assert adaptive_ranks[0] == 16 and adaptive_ranks[-1] == 8, adaptive_ranks  # full-gradient step, then factors
