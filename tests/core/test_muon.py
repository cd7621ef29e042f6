"""MuonAdamW's Muon step: bit for bit torch.optim.Muon's with ns_dtype=bfloat16 and torch's kernels; with products
accumulated in float32 (fp32_accumulate), each product rounded once as torch's bfloat16 kernels round it; with float32,
the same update up to bfloat16 rounding, with singular values in NS_5's band; auto is float32 on CPU."""

import pytest
import torch

from lowcomm.model import Transformer, model_config
from lowcomm.optim import MuonAdamW, build_optimizer
from lowcomm.optim.muon import (NS_COEFFICIENTS, NS_EPS, accumulated_in_float32, native_bfloat16, newton_schulz,
                                ns_dtype_on, ns_matmul_on)

SHAPES = [(48, 16), (16, 48), (32, 32)]  # tall, wide, square
STEPS = 3


def matrices(seed: int = 0) -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*shape, generator=generator)) for shape in SHAPES]


def gradients(seed: int = 1) -> list[list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [[torch.randn(*shape, generator=generator) for shape in SHAPES] for _ in range(STEPS)]


def train(params: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer, steps: list[list[torch.Tensor]]) -> None:
    for grads in steps:
        for p, g in zip(params, grads):
            p.grad = g.clone()
        optimizer.step()


def muon_adamw(params: list[torch.nn.Parameter], **options) -> MuonAdamW:
    return MuonAdamW([dict(params=params, algorithm="muon")], **options)


def well_conditioned(shape: tuple[int, int], generator: torch.Generator) -> torch.Tensor:
    """U diag(s) V^T with singular values s spread over [0.1, 1] (condition number 10)."""
    rows, cols = shape
    rank = min(rows, cols)
    u = torch.linalg.qr(torch.randn(rows, rank, generator=generator))[0]
    v = torch.linalg.qr(torch.randn(cols, rank, generator=generator))[0]
    return u @ torch.diag(torch.linspace(0.1, 1.0, rank)) @ v.T


@pytest.mark.parametrize("nesterov", [True, False])
@pytest.mark.parametrize("adjust_lr_fn", ["original", "match_rms_adamw"])
def test_bfloat16_steps_equal_torch_muon_bit_for_bit(nesterov, adjust_lr_fn):
    options = dict(lr=0.03, momentum=0.9, nesterov=nesterov, weight_decay=0.1, adjust_lr_fn=adjust_lr_fn)
    params, reference = matrices(), matrices()
    optimizer = muon_adamw(params, ns_dtype="bfloat16", ns_matmul="torch", **options)
    torch_muon = torch.optim.Muon(reference, **options)
    train(params, optimizer, gradients())
    train(reference, torch_muon, gradients())
    for p, q in zip(params, reference):
        assert torch.equal(p, q)
        assert torch.equal(optimizer.state[p]["momentum_buffer"], torch_muon.state[q]["momentum_buffer"])


def test_groups_and_state_carry_torch_muons_keys():
    """So checkpoints written while MuonAdamW ran torch.optim.Muon load and step as before."""
    params, reference = matrices(), matrices()
    optimizer, torch_muon = muon_adamw(params), torch.optim.Muon(reference)
    assert set(optimizer.param_groups[0]) == set(torch_muon.param_groups[0]) | {"algorithm"}
    assert (optimizer.param_groups[0]["ns_coefficients"], optimizer.param_groups[0]["eps"]) == (
        torch_muon.defaults["ns_coefficients"], torch_muon.defaults["eps"]) == (NS_COEFFICIENTS, NS_EPS)
    train(params, optimizer, gradients()[:1])
    assert all(set(optimizer.state[p]) == {"momentum_buffer"} for p in params)


def test_float32_update_agrees_with_torch_bfloat16_update():
    """One step from zero momentum, without weight decay, is -lr' NS_5(G): float32 NS_5 against torch's bfloat16 one
    differs by at most 1.9% in relative Frobenius norm (measured on these shapes and on cpu-model shapes 128 x 512,
    512 x 128, 128 x 128, Gaussian and well-conditioned inputs, five seeds each), bound here at 4%."""
    params, reference = matrices(), matrices()
    before = [p.detach().clone() for p in params]
    train(params, muon_adamw(params, ns_dtype="float32", weight_decay=0.0), gradients()[:1])
    train(reference, torch.optim.Muon(reference, lr=0.02, weight_decay=0.0), gradients()[:1])
    for p, q, x in zip(params, reference, before):
        ours, torchs = p.detach() - x, q.detach() - x
        assert (ours - torchs).norm() / torchs.norm() < 0.04


def bfloat16_ulps(x: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """|x - exact| in units of bfloat16's spacing at exact (2^(e - 7) for exact in [2^e, 2^(e+1)))."""
    spacing = torch.exp2(torch.floor(torch.log2(exact.abs().clamp(min=1e-30))) - 7)
    return (x.double() - exact).abs() / spacing


@pytest.mark.parametrize("inner", [128, 512])
def test_fp32_accumulate_rounds_each_product_once_as_torchs_kernel(inner):
    """beta C + alpha A B of bfloat16 operands against its exact (float64) value: accumulated_in_float32 and torch's
    bfloat16 addmm each land on the nearest bfloat16 (within 0.5 ulp) on all but the elements where float32 summation
    error or cancellation decides the rounding (measured on an AVX2 CPU: 1.2e-4 and 3.1e-4 of them at k = 128 and 512,
    torch's 6.1e-5 at both; bound at 1e-3); a product rounded to bfloat16 before the sum misses on 27-29 % of them."""
    generator = torch.Generator().manual_seed(0)
    c, a, b = (torch.randn(*shape, generator=generator).bfloat16() for shape in [(128, 128), (128, inner),
                                                                               (inner, 128)])
    beta, alpha = NS_COEFFICIENTS[1], NS_COEFFICIENTS[2]
    exact = beta * c.double() + alpha * (a.double() @ b.double())
    for result in accumulated_in_float32(torch.addmm, c, a, b, beta=beta, alpha=alpha), torch.addmm(
            c, a, b, beta=beta, alpha=alpha):
        assert result.dtype == torch.bfloat16
        assert (bfloat16_ulps(result, exact) > 0.5 + 1e-3).double().mean() < 1e-3
    assert torch.equal(accumulated_in_float32(torch.mm, a, b), (a.float() @ b.float()).bfloat16())


@pytest.mark.parametrize("shape", [(128, 512), (512, 128), (128, 128)])
def test_fp32_accumulate_newton_schulz_agrees_with_torchs_bfloat16_one(shape):
    """NS_5 in bfloat16 with products accumulated in float32 against torch's kernels differs by bfloat16 rounding
    only, which five iterations carry to 0.3-0.7 % (relative Frobenius, cpu-model shapes; torch's own result against
    float64 products differs as much), bound here at 2 %."""
    matrix = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    ours, torchs = (newton_schulz(matrix, 5, NS_COEFFICIENTS, NS_EPS, torch.bfloat16, matmul).float()
                    for matmul in ("fp32_accumulate", "torch"))
    assert (ours - torchs).norm() / torchs.norm() < 0.02


def test_auto_matmul_accumulates_in_float32_where_torchs_bfloat16_kernel_is_the_fallback():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert ns_matmul_on("auto", torch.bfloat16, cpu) == ("torch" if native_bfloat16() else "fp32_accumulate")
    assert ns_matmul_on("auto", torch.float32, cpu) == ns_matmul_on("auto", torch.bfloat16, cuda) == "torch"
    assert ns_matmul_on("fp32_accumulate", torch.float32, cuda) == "fp32_accumulate"


@pytest.mark.parametrize("shape", [*SHAPES, (128, 512), (512, 128), (128, 128)])
def test_float32_newton_schulz_singular_values_lie_in_the_ns5_band(shape):
    """NS_5 maps the singular values of a well-conditioned M (here in [0.1, 1]) into about [0.5, 1.5], not onto 1:
    measured [0.682, 1.134] in float32 on every shape here, bound at [0.6, 1.2]."""
    generator = torch.Generator().manual_seed(0)
    o = newton_schulz(well_conditioned(shape, generator), 5, NS_COEFFICIENTS, NS_EPS, torch.float32)
    assert o.dtype == torch.float32
    singular_values = torch.linalg.svdvals(o.double())
    assert 0.6 < singular_values.min() and singular_values.max() < 1.2


def test_auto_is_float32_on_cpu_and_bfloat16_on_gpus():
    assert ns_dtype_on("auto", torch.device("cpu")) == torch.float32
    assert ns_dtype_on("auto", torch.device("cuda")) == torch.bfloat16
    params, reference = matrices(), matrices()
    train(params, muon_adamw(params, ns_dtype="auto"), gradients())
    train(reference, muon_adamw(reference, ns_dtype="float32"), gradients())
    assert all(torch.equal(p, q) for p, q in zip(params, reference))


def test_an_unknown_ns_dtype_or_ns_matmul_is_named():
    with pytest.raises(ValueError, match="optim.ns_dtype='float16' is invalid"):
        build_optimizer({"name": "muon", "ns_dtype": "float16"}, Transformer(model_config("smoke")))
    with pytest.raises(ValueError, match="optim.ns_matmul='blas' is invalid: use one of"):
        build_optimizer({"name": "muon", "ns_matmul": "blas"}, Transformer(model_config("smoke")))
