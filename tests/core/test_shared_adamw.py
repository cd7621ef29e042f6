"""Every method steps the embedding, head and norms with the same torch.optim.AdamW: bit-identical updates."""

import pytest
import torch

from lowcomm.model import Transformer, model_config
from lowcomm.optim import build_optimizer

OPTIONS = dict(lr=3e-3, weight_decay=0.1, betas=(0.8, 0.9), eps=1e-7)
SPECTRAL = ("muon", "dion", "orth_dion", "ada_orth_dion")
STEPS = 3


def gradients(model: Transformer) -> list[dict[str, torch.Tensor]]:
    """The same synthetic gradients for every parameter at every step, whatever the method."""
    generator = torch.Generator().manual_seed(1)
    return [{n: torch.randn(p.shape, generator=generator) for n, p in model.named_parameters()} for _ in range(STEPS)]


def trained_embedding(name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(embedding after STEPS steps of method `name`, its initial value)."""
    torch.manual_seed(0)
    model = Transformer(model_config("smoke"))
    initial = model.embed.weight.detach().clone()
    options = {"name": name, **OPTIONS, **({"adamw_lr": OPTIONS["lr"]} if name in SPECTRAL else {})}
    optimizer = build_optimizer(options, model)
    for step_grads in gradients(model):
        for n, p in model.named_parameters():
            p.grad = step_grads[n].clone()
        if name == "lordo_local_step" and "basis" not in optimizer.state[optimizer.lowrank_params()[0]]:
            optimizer.set_bases_from([p.grad for p in optimizer.lowrank_params()])
        optimizer.step()
    return model.embed.weight.detach(), initial


@pytest.mark.parametrize("name", ["adamw", *SPECTRAL, "lordo_local_step", "galore", "ldadam"])
def test_embedding_update_equals_torch_adamw(name):
    embedding, initial = trained_embedding(name)
    reference = torch.nn.Parameter(initial.clone())
    adamw = torch.optim.AdamW([reference], foreach=True, **OPTIONS)
    torch.manual_seed(0)
    for step_grads in gradients(Transformer(model_config("smoke"))):
        reference.grad = step_grads["embed.weight"].clone()
        adamw.step()
    assert torch.equal(embedding, reference.detach())
