import math

import pytest
import torch

from lowcomm.model import (
    SIZES,
    Transformer,
    apply_rope,
    model_config,
    parameter_count,
    rope_tables,
)


def test_causality_future_token_does_not_change_past_logits():
    torch.manual_seed(0)
    model = Transformer(model_config("smoke")).eval()
    tokens = torch.randint(0, 512, (2, 32))
    t = 17
    changed = tokens.clone()
    changed[:, t + 1] = (changed[:, t + 1] + 1) % 512
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    assert torch.equal(a[:, : t + 1], b[:, : t + 1])
    assert not torch.allclose(a[:, t + 1], b[:, t + 1])


@pytest.mark.parametrize("size,millions", [("lordo-16m", 16), ("lordo-125m", 125), ("lordo-720m", 720),
                                           ("gpt2-45m", 45), ("llama3-320m", 320)])
def test_paper_sizes_match_their_names(size, millions):
    count = parameter_count(SIZES[size])
    assert abs(count / 1e6 - millions) / millions < 0.05, count


def test_swiglu_and_untied_head_change_the_parameter_count():
    base = model_config("smoke")
    gated = model_config("smoke", mlp="swiglu")
    untied = model_config("smoke", tied_embeddings=False)
    d, h, v = base.d_model, base.hidden, base.vocab_size
    assert parameter_count(gated) - parameter_count(base) == base.n_layers * d * h
    assert parameter_count(untied) - parameter_count(base) == d * v


def test_context_longer_than_model_supports_is_an_error():
    model = Transformer(model_config("smoke"))
    with pytest.raises(ValueError, match="max_context"):
        model(torch.zeros(1, 65, dtype=torch.long))


def test_unknown_size_names_the_choices():
    with pytest.raises(ValueError, match="lordo-16m"):
        model_config("tiny")


def test_hidden_matrices_are_attention_and_mlp_weights():
    model = Transformer(model_config("smoke", mlp="swiglu"))
    names = [n for n, _ in model.hidden_matrices()]
    per_layer = ["attn.q.weight", "attn.k.weight", "attn.v.weight", "attn.proj.weight", "mlp.up.weight",
                 "mlp.gate.weight", "mlp.down.weight"]  # q, k, v separate: each its own matrix for the optimizers
    assert names == [f"blocks.{i}.{n}" for i in range(model.cfg.n_layers) for n in per_layer]
    d = model.cfg.d_model
    assert all(p.shape == (d, d) for n, p in model.hidden_matrices() if ".attn." in n)


def test_attention_equals_a_per_head_reference():
    """Separate q, k, v projections: head h uses rows h*hd..(h+1)*hd of each, RoPE on q and k, causal softmax."""
    torch.manual_seed(0)
    cfg = model_config("smoke")
    attn = Transformer(cfg).blocks[0].attn
    x = torch.randn(2, 10, cfg.d_model)
    cos, sin = rope_tables(cfg.d_model // cfg.n_heads, 10, cfg.rope_theta)
    hd = cfg.d_model // cfg.n_heads
    heads = []
    for h in range(cfg.n_heads):
        rows = slice(h * hd, (h + 1) * hd)
        q, k, v = (x @ w.weight[rows].T for w in (attn.q, attn.k, attn.v))
        q, k = apply_rope(q.unsqueeze(1), cos, sin).squeeze(1), apply_rope(k.unsqueeze(1), cos, sin).squeeze(1)
        scores = (q @ k.transpose(1, 2)) / math.sqrt(hd)
        scores = scores.masked_fill(torch.ones(10, 10, dtype=torch.bool).triu(1), float("-inf"))
        heads.append(scores.softmax(-1) @ v)
    expected = torch.cat(heads, dim=-1) @ attn.proj.weight.T
    torch.testing.assert_close(attn(x, cos, sin), expected, atol=1e-5, rtol=1e-5)
