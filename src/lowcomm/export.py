"""`python -m lowcomm.export RUN_DIR OUT_DIR`: a trained model as a Hugging Face transformers checkpoint
(config.json, model.safetensors, generation_config.json, the tokenizer) in stock architectures, no remote code.

Both MLPs map onto a stock architecture exactly: SwiGLU onto `LlamaForCausalLM`, the non-gated GELU MLP onto
`ArceeForCausalLM` (Llama with the MLP down(act(up x))). Both use RMSNorm, separate q/k/v/o without biases and
half-split RoPE, which our interleaved RoPE becomes by permuting the rows of q and k within each head:
row 2i -> i, row 2i+1 -> i + head_dim/2.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import torch
from transformers import ArceeConfig, AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

from lowcomm.data import EOS, DataUnavailable
from lowcomm.eval.evaluate import EvaluationError, load_run
from lowcomm.model import ModelConfig, Transformer
from lowcomm.quiet import no_progress_bars

# our parameter names -> transformers' (Llama / Arcee), for the top level and for the modules of block i
TOP_NAMES = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
             "lm_head.weight": "lm_head.weight"}
BLOCK_NAMES = {"attn_norm": "input_layernorm", "attn.q": "self_attn.q_proj", "attn.k": "self_attn.k_proj",
               "attn.v": "self_attn.v_proj", "attn.proj": "self_attn.o_proj", "mlp_norm": "post_attention_layernorm",
               "mlp.gate": "mlp.gate_proj", "mlp.up": "mlp.up_proj", "mlp.down": "mlp.down_proj"}


class ExportError(ValueError):
    """A run that cannot be exported where asked; the message names the fix."""


def hf_config(cfg: ModelConfig, eos_id: int) -> LlamaConfig | ArceeConfig:
    """The stock config of the same network: Llama for swiglu, Arcee (non-gated MLP) with exact GELU for gelu."""
    config_class, act = (LlamaConfig, "silu") if cfg.mlp == "swiglu" else (ArceeConfig, "gelu")
    return config_class(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.hidden,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_heads,
        hidden_act=act, max_position_embeddings=cfg.max_context, rms_norm_eps=cfg.norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        tie_word_embeddings=cfg.tied_embeddings, attention_bias=False, mlp_bias=False,
        bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=None,
    )


def half_split_rows(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """q or k (n_heads * head_dim, d) with rotated pairs (2i, 2i+1) per head -> pairs (i, i + head_dim/2)."""
    out, d = weight.shape
    return weight.view(n_heads, out // n_heads // 2, 2, d).transpose(1, 2).reshape(out, d)


def hf_name(name: str) -> str:
    """transformers' name of one of our parameters: blocks.3.attn.q.weight -> model.layers.3.self_attn.q_proj.weight."""
    if not name.startswith("blocks."):
        return TOP_NAMES[name]
    _, layer, module = name.removesuffix(".weight").split(".", 2)
    return f"model.layers.{layer}.{BLOCK_NAMES[module]}.weight"


def hf_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """Our weights under transformers' names, q and k rows in half-split order; lm_head is the embedding when tied."""
    tensors = {}
    for name, weight in model.state_dict().items():
        if name.endswith(("attn.q.weight", "attn.k.weight")):
            weight = half_split_rows(weight, model.cfg.n_heads)
        tensors[hf_name(name)] = weight
    tensors.setdefault("lm_head.weight", tensors["model.embed_tokens.weight"])
    return tensors


def hf_model(model: Transformer, eos_id: int):
    """The transformers model with our weights (every parameter loaded, none left over)."""
    hf = AutoModelForCausalLM.from_config(hf_config(model.cfg, eos_id), dtype=model.embed.weight.dtype)
    hf.load_state_dict(hf_state_dict(model), strict=True)
    return hf.eval()


def hf_tokenizer(tokenizer, max_context: int) -> PreTrainedTokenizerFast:
    """Our `tokenizers` tokenizer as a transformers fast tokenizer: EOS as eos, no BOS or other added tokens (a run's
    documents are joined by EOS, and lm-eval conditions an empty context on it), inputs up to max_context."""
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS, model_max_length=max_context)


def check_out_dir(out_dir: Path) -> None:
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ExportError(f"{out_dir} already exists and is not an empty directory: give a new OUT_DIR "
                          "or remove that one")


def export_run(run_dir: str | Path, out_dir: str | Path) -> Path:
    """Write the run's model and tokenizer to out_dir, created whole: written into a temporary directory beside it,
    then renamed, so out_dir holds a complete export or nothing."""
    out_dir = Path(out_dir)
    check_out_dir(out_dir)
    model, tokenizer = load_run(run_dir)
    eos_id = tokenizer.token_to_id(EOS)
    if eos_id is None:
        raise ExportError(f"the run's tokenizer has no {EOS} token, which marks document starts and ends")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir.parent, prefix=f".{out_dir.name}.") as tmp:
        staged = Path(tmp) / out_dir.name
        with no_progress_bars():  # transformers' "Writing model shards"
            hf_model(model, eos_id).save_pretrained(staged)
            hf_tokenizer(tokenizer, model.cfg.max_context).save_pretrained(staged)
        check_out_dir(out_dir)
        os.replace(staged, out_dir)
    return out_dir


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m lowcomm.export", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", metavar="RUN_DIR",
                        help="a finished run directory (with model.pt and config.yaml) or the model.pt inside one")
    parser.add_argument("out_dir", metavar="OUT_DIR", type=Path,
                        help="where to write the checkpoint: a new or empty directory")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        out_dir = export_run(args.run_dir, args.out_dir)
    except (ExportError, EvaluationError, DataUnavailable) as err:
        sys.exit(f"error: {err}")
    print(f"wrote {out_dir}: load it with transformers' AutoModelForCausalLM.from_pretrained and AutoTokenizer")


if __name__ == "__main__":
    main()
