"""The compressed pseudo-gradient: error feedback loses nothing, density 1 at 32 bits is the dense sync, the codec
round-trips, and on 1 and 2 gloo workers every compressed method ends a sync with bit-identical replicas and puts
exactly the formula's bytes on the wire."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from support import build, train_step

from lowcomm.distributed.comm import Communicator
from lowcomm.distributed.compression import (
    ChunkCodec,
    CompressedPseudoGradient,
    Compression,
    message_bytes,
    pack,
    unpack,
)
from lowcomm.distributed.options import sync_options

K = 4
COMPRESSED = {"density": 0.05, "bits": 2, "chunk": 64}
METHODS_COMPRESSED = ("diloco", "local_adam", "lordo", "lordo_local", "muloco", "orth_dion_local")


def compression(**changes) -> Compression:
    return Compression(**{"density": 0.1, "bits": 4, "chunk": 16, "rounding": "nearest", "ef_beta": 1.0, **changes})


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_pack_unpack_round_trip(bits):
    q = torch.randint(0, 2 ** bits, (3, 11))
    packed = pack(q, bits)
    assert packed.dtype == torch.uint8 and packed.shape == (3, -(-11 * bits // 8))
    assert torch.equal(unpack(packed, bits, 11), q)


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
@pytest.mark.parametrize("bits", [2, 8, 32])
def test_error_feedback_loses_nothing(bits, rounding):
    """beta_e = 1: sum of what was sent (decoded) + e = sum of the inputs, over steps."""
    p = torch.nn.Parameter(torch.zeros(5, 13, dtype=torch.float64))
    sync = CompressedPseudoGradient([p], Communicator(), compression(bits=bits, rounding=rounding))
    generator = torch.Generator().manual_seed(0)
    inputs = [torch.randn(5, 13, generator=generator, dtype=torch.float64) for _ in range(6)]
    sent = sum(sync([d])[0] for d in inputs)
    torch.testing.assert_close(sent + sync.errors[0], sum(inputs), rtol=0, atol=1e-12)
    assert (sync([inputs[0]])[0] != 0).sum() <= 5 * 2  # k = ceil(0.1 x 16) = 2 in each of the 5 chunks of 65


def test_the_kept_entries_are_the_largest_of_their_chunk_and_decode_within_half_a_level():
    c = compression(density=0.25, bits=8, chunk=8)
    codec = ChunkCodec(c, torch.Generator())
    flat = torch.tensor([0.1, -3.0, 0.2, 2.0, 0.0, 0.05, -0.3, 1.0, 5.0, 0, 0, 0, 0, 0, 0, -4.0])
    decoded = codec.decode(codec.encode(flat), flat.numel(), flat.dtype)
    assert torch.equal(decoded.nonzero().flatten(), torch.tensor([1, 3, 8, 15]))
    step = 2 * torch.tensor([3.0, 3.0, 5.0, 5.0]) / 255  # one level of the chunk's scale
    assert ((decoded[[1, 3, 8, 15]] - flat[[1, 3, 8, 15]]).abs() <= step / 2 + 1e-6).all()


def test_density_one_at_32_bits_is_the_dense_sync():
    p = torch.nn.Parameter(torch.zeros(7, 9))
    sync = CompressedPseudoGradient([p], Communicator(), compression(density=1.0, bits=32, ef_beta=0.5))
    for seed in range(3):
        d = torch.randn(7, 9, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(sync([d])[0], d) and not sync.errors[0].any()


def test_message_bytes_formula():
    assert message_bytes(100, compression(density=0.1, bits=2, chunk=16)) == 7 * (1 + 2 * 2 + 4)
    assert message_bytes(100, compression(density=1.0, bits=4, chunk=16)) == 7 * (8 + 0 + 4)
    assert message_bytes(100, compression(density=0.5, bits=32, chunk=16)) == 7 * (4 * 8 + 2 * 8)


@pytest.mark.parametrize("key, value, words", [("compress_bits", 3, "compress_bits=3"),
                                               ("compress_density", 0.0, "compress_density=0.0"),
                                               ("compress_chunk", 40000, "at most 32768"),
                                               ("compress_rounding", "up", "compress_rounding='up'")])
def test_bad_compression_options_are_named(key, value, words):
    with pytest.raises(ValueError, match=words):
        sync_options({"name": "diloco", "compress": True, key: value})
    with pytest.raises(ValueError, match="K-step method"):
        sync_options({"name": "ddp", "compress": True})
    with pytest.raises(ValueError, match="use it with sync.compress=true on lordo"):
        sync_options({"name": "diloco", "compress": True, "probe_dense_basis": True})


def dense_probe_runs(rank: int) -> dict:
    """lordo with a compressed Delta: per setting (the test's compression; density 1 at 32 bits), with and without
    the dense-basis probe: the weights after 2 syncs, the method's bytes, and the probe's angles at each sync."""
    settings = {"compressed": COMPRESSED, "full": {"density": 1.0, "bits": 32, "chunk": 64}}
    out = {}
    for setting, options in settings.items():
        for probe in (False, True):
            comm = Communicator()
            sync = {"sync_every": K, "compress": True, "probe_dense_basis": probe,
                    **{f"compress_{k}": v for k, v in options.items()}}
            model, optimizer, engine = build("lordo", comm, sync=sync)
            engine.setup()
            angles = []
            for t in range(1, 2 * K + 1):
                train_step(model, optimizer, engine, t, rank)
                if probe and t % K == 0:
                    angles.append(engine.metrics()["probe/dense_basis_max_angle"])
            out[setting, probe] = {"weights": [p.detach().clone() for p in model.parameters()], "angles": angles,
                                   "bytes": comm.wire_bytes_by_step()}
    return out


def compressed_runs(rank: int) -> dict:
    """Every compressed method: weights after each sync, and the ledger by step and kind."""
    out = {}
    for method in METHODS_COMPRESSED:
        comm = Communicator()
        sync = {"sync_every": K, "compress": True, **{f"compress_{k}": v for k, v in COMPRESSED.items()}}
        model, optimizer, engine = build(method, comm, sync=sync)
        engine.setup()
        synced = {}
        for t in range(1, 2 * K + 1):
            train_step(model, optimizer, engine, t, rank)
            if t % K == 0:
                synced[t] = [p.detach().clone() for p in model.parameters()]
        out[method] = {"synced": synced, "bytes": comm.wire_bytes_by_step(),
                       "payload": sum(r.payload for r in comm.records if r.kind == "pseudo_gradient" and r.step == K),
                       "numels": [p.numel() for p in model.parameters()], "world": comm.world_size}
    return out


def worker(rank: int, world: int, tmp: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/init", rank=rank, world_size=world)
    try:
        torch.save({**compressed_runs(rank), "dense_probe": dense_probe_runs(rank)}, os.path.join(tmp, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module", params=[1, 2], ids=["1 worker", "2 workers"])
def ranks(request, tmp_path_factory) -> list[dict]:
    tmp = str(tmp_path_factory.mktemp("gloo"))
    mp.spawn(worker, args=(request.param, tmp), nprocs=request.param, join=True)
    return [torch.load(os.path.join(tmp, f"rank{r}.pt"), weights_only=False) for r in range(request.param)]


@pytest.mark.parametrize("method", METHODS_COMPRESSED)
def test_replicas_are_bit_identical_after_every_sync(ranks, method):
    for t, weights in ranks[0][method]["synced"].items():
        for other in ranks[1:]:
            assert all(torch.equal(a, b) for a, b in zip(weights, other[method]["synced"][t])), (method, t)


@pytest.mark.parametrize("method", METHODS_COMPRESSED)
def test_bytes_on_the_wire_equal_the_formula(ranks, method):
    run = ranks[0][method]
    c = Compression(COMPRESSED["density"], COMPRESSED["bits"], COMPRESSED["chunk"], "nearest", 0.95)
    payload = sum(message_bytes(n, c) for n in run["numels"])
    assert run["payload"] == payload
    assert run["bytes"].get(K, {}).get("pseudo_gradient", 0.0) == (run["world"] - 1) * payload
    dense = 4 * sum(run["numels"])
    assert payload < dense / 10  # 5 % of the entries at 2 bits plus 16-bit offsets


def test_dense_basis_probe_measures_the_compressed_basis_and_changes_nothing(ranks):
    """At density 1 and 32 bits the compressed Delta is the dense one: angle 0 (to fp32 round-off). At 5 % density
    and 2 bits the bases differ. The probe changes neither the weights nor the method's ledger."""
    runs = ranks[0]["dense_probe"]
    for setting in ("compressed", "full"):
        plain, probed = runs[setting, False], runs[setting, True]
        assert all(torch.equal(a, b) for a, b in zip(plain["weights"], probed["weights"])), setting
        assert plain["bytes"] == probed["bytes"], setting
    assert max(runs["full", True]["angles"]) < 1e-2  # fp32 SVD bases: about 2e-3 rad between equal subspaces
    assert min(runs["compressed", True]["angles"]) > 0.1
